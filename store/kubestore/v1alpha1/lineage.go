package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeletLineage is the kubelet client certificates issued to the
// enrolment that owns a node name (store.Lineage): the certificate issued
// for the CSR that carried the enrolment's bound kubelet key, then each
// one issued for a renewal that one of them authenticated. The approver
// approves a CSR the node makes itself (a renewal, a serving certificate)
// only when the client certificate that authenticated it — the API
// server's credential ID, X509SHA256=<hex> — is in the lineage of the
// name's current owner. Its name is the node name.
//
// Only the approver writes lineages (deploy/approver/rbac.yaml); neither
// nodes nor the server may. A lineage whose identity, boundAt or kubelet
// key is not the NodeBinding's belongs to a previous enrolment, and counts
// for nothing.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=nodeproof
// +kubebuilder:printcolumn:name="Identity",type=string,JSONPath=".spec.identity",priority=1
// +kubebuilder:printcolumn:name="Bound",type=date,JSONPath=".spec.boundAt"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.spec.nodeName",message="the name is the node name"
type KubeletLineage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec KubeletLineageSpec `json:"spec"`
}

// KubeletLineageSpec is a store.Lineage.
type KubeletLineageSpec struct {
	// NodeName is the node name (and the object's name).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// Identity is the owning enrolment's evidence identity.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Identity string `json:"identity"`
	// BoundAt is the NodeBinding's createdAt: when the identity enrolled
	// under the name.
	// +required
	BoundAt metav1.MicroTime `json:"boundAt"`
	// KubeletKeySHA256 is the kubelet key the enrolment bound, as 64
	// lower-case hex digits.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	KubeletKeySHA256 string `json:"kubeletKeySHA256"`
	// Certificates are the issued kubelet client certificates, newest
	// first (store.MaxLineageCertificates).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Certificates []IssuedCertificate `json:"certificates,omitempty"`
}

// IssuedCertificate is one kubelet client certificate of a lineage.
type IssuedCertificate struct {
	// SHA256 is the SHA-256 of the certificate's DER, as 64 lower-case hex
	// digits (the API server's credential ID is X509SHA256=<this>).
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	SHA256 string `json:"sha256"`
	// CSR is the CSR it was issued for (name/UID).
	// +required
	// +kubebuilder:validation:MaxLength=512
	CSR string `json:"csr"`
	// NotAfter is when the certificate expires.
	// +required
	NotAfter metav1.MicroTime `json:"notAfter"`
	// RecordedAt is when the approver saw it issued.
	// +required
	RecordedAt metav1.MicroTime `json:"recordedAt"`
}

// KubeletLineageList is a list of KubeletLineages.
//
// +kubebuilder:object:root=true
type KubeletLineageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KubeletLineage `json:"items"`
}
