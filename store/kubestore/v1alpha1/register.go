package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of these types.
var GroupVersion = schema.GroupVersion{Group: "nodeproof.io", Version: "v1alpha1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this group and version to a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&NodeAttestation{}, &NodeAttestationList{},
		&AttestationMarker{}, &AttestationMarkerList{},
		&NodeBinding{}, &NodeBindingList{},
		&IdentityBan{}, &IdentityBanList{},
		&NodeNameHistory{}, &NodeNameHistoryList{},
		&KubeletLineage{}, &KubeletLineageList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
