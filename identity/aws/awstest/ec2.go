package awstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
)

// Instance is an EC2 instance as the fake EC2 API reports it.
type Instance struct {
	OwnerID          string // account
	InstanceID       string
	ImageID          string
	InstanceType     string
	State            string // pending, running, shutting-down, terminated, stopping, stopped
	AvailabilityZone string
	PrivateIP        string
	PrivateDNSName   string
	VPCID            string
	SubnetID         string
	Tags             map[string]string
}

// InstanceOf returns the instance d describes as EC2 reports it while it
// runs: d's account, ID, image, type, zone and private IP, private DNS name
// <instance ID>.ec2.internal, in vpc-1 and subnet-1, tagged role=worker and
// kubernetes.io/cluster/demo=owned.
func InstanceOf(d Document) Instance {
	return Instance{
		OwnerID: d.AccountID, InstanceID: d.InstanceID, ImageID: d.ImageID, InstanceType: d.InstanceType,
		State: "running", AvailabilityZone: d.AvailabilityZone, PrivateIP: d.PrivateIP,
		PrivateDNSName: d.InstanceID + ".ec2.internal", VPCID: "vpc-1", SubnetID: "subnet-1",
		Tags: map[string]string{"role": "worker", "kubernetes.io/cluster/demo": "owned"},
	}
}

// stateCodes are EC2's instance state codes.
var stateCodes = map[string]int{
	"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80,
}

var instanceIDRE = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)

// EC2 is a loopback EC2 Query API (the ec2 protocol: form-encoded POST,
// XML answers) implementing DescribeInstances by InstanceId.N, as EC2 does:
//   - requests must be SigV4-signed for the ec2 service (401 AuthFailure);
//   - an ID that is not of the form i-<hex> is InvalidInstanceID.Malformed
//     and an unknown one InvalidInstanceID.NotFound (400);
//   - the answer is a DescribeInstancesResponse with a reservationSet.
//
// SetDown(true) makes it answer every request 503 Unavailable.
type EC2 struct {
	// URL is the base URL, for ec2.Options.BaseEndpoint.
	URL string

	srv *httptest.Server

	mu        sync.Mutex
	instances map[string]Instance
	down      bool
	calls     int
	keyIDs    []string
}

// NewEC2 starts a fake EC2 API holding instances. Close it when done.
func NewEC2(instances ...Instance) *EC2 {
	e := &EC2{instances: make(map[string]Instance)}
	for _, in := range instances {
		e.instances[in.InstanceID] = in
	}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	e.URL = e.srv.URL
	return e
}

// Close stops the server.
func (e *EC2) Close() { e.srv.Close() }

// Put adds or replaces an instance.
func (e *EC2) Put(in Instance) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.instances[in.InstanceID] = in
}

// SetDown makes the API answer 503 (true) or work again (false).
func (e *EC2) SetDown(down bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.down = down
}

// Calls counts the requests received.
func (e *EC2) Calls() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

// AccessKeyIDs returns the access key IDs that signed the requests
// received, in order (the Credential= of each SigV4 Authorization).
func (e *EC2) AccessKeyIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.keyIDs...)
}

// Client returns an aws-sdk-go-v2 EC2 client for this API in region, with
// static test credentials and no retries.
func (e *EC2) Client(region string) *ec2.Client { return EC2Client(e.URL, region) }

// EC2Client returns an aws-sdk-go-v2 EC2 client for the EC2 API at
// baseURL in region, with static test credentials and no retries.
func EC2Client(baseURL, region string) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:       region,
		BaseEndpoint: aws.String(baseURL),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDAWSTEST", SecretAccessKey: "awstest-secret", Source: "awstest"}, nil
		}),
		Retryer: aws.NopRetryer{},
	})
}

func (e *EC2) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls++
	if e.down {
		writeError(w, http.StatusServiceUnavailable, "Unavailable", "The service is unavailable. Please try again shortly.")
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, http.StatusBadRequest, "InvalidAction", "The action is not valid for this web service.")
		return
	}
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") || !strings.Contains(auth, "/ec2/aws4_request") {
		writeError(w, http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials")
		return
	}
	if _, cred, ok := strings.Cut(auth, "Credential="); ok {
		id, _, _ := strings.Cut(cred, "/")
		e.keyIDs = append(e.keyIDs, id)
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "MalformedQueryString", err.Error())
		return
	}
	if a := r.PostForm.Get("Action"); a != "DescribeInstances" {
		writeError(w, http.StatusBadRequest, "InvalidAction", fmt.Sprintf("The action %s is not valid for this web service.", a))
		return
	}
	if r.PostForm.Get("Version") == "" {
		writeError(w, http.StatusBadRequest, "MissingParameter", "The request must contain the parameter Version")
		return
	}
	var ids []string
	for k, vs := range r.PostForm {
		switch {
		case strings.HasPrefix(k, "InstanceId."):
			ids = append(ids, vs...)
		case k == "Action" || k == "Version":
		default:
			writeError(w, http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("the fake EC2 API does not support %s", k))
			return
		}
	}
	sort.Strings(ids)
	resp := describeInstancesResponse{Xmlns: "http://ec2.amazonaws.com/doc/2016-11-15/", RequestID: requestID()}
	for _, id := range ids {
		if !instanceIDRE.MatchString(id) {
			writeError(w, http.StatusBadRequest, "InvalidInstanceID.Malformed", fmt.Sprintf("Invalid id: %q", id))
			return
		}
		in, ok := e.instances[id]
		if !ok {
			writeError(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
			return
		}
		resp.Reservations = append(resp.Reservations, reservationXML{
			ReservationID: "r-" + strings.TrimPrefix(id, "i-"),
			OwnerID:       in.OwnerID,
			Instances:     []instanceXML{toXML(in)},
		})
	}
	if len(ids) == 0 {
		for _, in := range e.instances {
			resp.Reservations = append(resp.Reservations, reservationXML{OwnerID: in.OwnerID, Instances: []instanceXML{toXML(in)}})
		}
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.Write([]byte(xml.Header))
	xml.NewEncoder(w).Encode(resp)
}

func toXML(in Instance) instanceXML {
	x := instanceXML{
		InstanceID: in.InstanceID, ImageID: in.ImageID, InstanceType: in.InstanceType,
		PrivateDNSName: in.PrivateDNSName, PrivateIP: in.PrivateIP, VPCID: in.VPCID, SubnetID: in.SubnetID,
	}
	x.State.Name = in.State
	x.State.Code = stateCodes[in.State]
	x.Placement.AvailabilityZone = in.AvailabilityZone
	x.Placement.Tenancy = "default"
	keys := make([]string, 0, len(in.Tags))
	for k := range in.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x.Tags = append(x.Tags, tagXML{Key: k, Value: in.Tags[k]})
	}
	return x
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	w.Write([]byte(xml.Header))
	xml.NewEncoder(w).Encode(errorResponse{
		Errors:    []errorXML{{Code: code, Message: msg}},
		RequestID: requestID(),
	})
}

func requestID() string {
	b := make([]byte, 16)
	rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

type describeInstancesResponse struct {
	XMLName      xml.Name         `xml:"DescribeInstancesResponse"`
	Xmlns        string           `xml:"xmlns,attr"`
	RequestID    string           `xml:"requestId"`
	Reservations []reservationXML `xml:"reservationSet>item"`
}

type reservationXML struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type instanceXML struct {
	InstanceID string `xml:"instanceId"`
	ImageID    string `xml:"imageId"`
	State      struct {
		Code int    `xml:"code"`
		Name string `xml:"name"`
	} `xml:"instanceState"`
	PrivateDNSName string `xml:"privateDnsName"`
	InstanceType   string `xml:"instanceType"`
	Placement      struct {
		AvailabilityZone string `xml:"availabilityZone"`
		Tenancy          string `xml:"tenancy"`
	} `xml:"placement"`
	SubnetID  string   `xml:"subnetId,omitempty"`
	VPCID     string   `xml:"vpcId,omitempty"`
	PrivateIP string   `xml:"privateIpAddress,omitempty"`
	Tags      []tagXML `xml:"tagSet>item"`
}

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type errorResponse struct {
	XMLName   xml.Name   `xml:"Response"`
	Errors    []errorXML `xml:"Errors>Error"`
	RequestID string     `xml:"RequestID"`
}

type errorXML struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}
