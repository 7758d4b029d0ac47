package mcs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/strictjson"
)

// decodeBody reads a JSON body strictly: bounded, one value, no member
// named twice at any depth, exactly or in another case (strictjson: as
// encoding/json would match it to a field, merging the two), no unknown
// fields. The body is held once as read (encoding/json's decoder buffers
// a whole value before it decodes it anyway) and decoded from there.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return deny(attest.ReasonMalformedRequest, "Content-Type must be application/json")
	}
	if r.ContentLength > limit {
		return deny(attest.ReasonBodyTooLarge, "body exceeds %d bytes", limit)
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + 1) // one read past it sees the end
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	body := buf.Bytes()
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return deny(attest.ReasonBodyTooLarge, "body exceeds %d bytes", limit)
	} else if err != nil {
		return deny(attest.ReasonMalformedRequest, "body: %v", err)
	}
	if err := strictjson.CheckNames(body); err != nil {
		return deny(attest.ReasonMalformedRequest, "body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil {
		// Only white space may follow the object.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("body holds more than one JSON value")
			if terr != nil {
				err = terr
			}
		}
	}
	if err != nil {
		return deny(attest.ReasonMalformedRequest, "body: %v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, d *decision, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // our own types always marshal
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	d.status = http.StatusOK
}
