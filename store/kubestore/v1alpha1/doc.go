// Package v1alpha1 holds the API types of nodeproof's Kubernetes store
// backend (store/kubestore), group nodeproof.io, version v1alpha1:
//
//   - NodeAttestation: what one successful attestation established (a
//     store.Record). The object's name is the record ID; the spec is
//     immutable once created; status says whether, when and by which CSR the
//     record was consumed, and cannot be changed again once it does.
//   - AttestationMarker: a single-use marker (a session answered, a config
//     token spent, an instance enrolled). Its name is a hash of the marker
//     key (MarkerName), so the API server's uniqueness of names is what makes
//     the marker single-use.
//
// The CustomResourceDefinitions in deploy/crds and zz_generated.deepcopy.go
// are generated from these types by controller-gen (`make generate`); a test
// in store/kubestore fails when they are out of date.
//
// +kubebuilder:object:generate=true
// +groupName=nodeproof.io
package v1alpha1
