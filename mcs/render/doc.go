// Package render turns MachineConfigs into the Ignition bytes the server
// serves: the OpenShift Machine Config Server's (MCS) spec negotiation,
// translation and appended files, plus nodeproof's public tier. It does no
// HTTP and no Kubernetes client work; mcs calls it, and cluster mode feeds
// it informer objects through NewInputs.
//
// # Spec negotiation
//
// Negotiate mirrors the MCS's detectSpecVersionFromAcceptHeader
// (machine-config-operator pkg/server/api.go), extended to spec 3.5 the
// way the MCS extended it for each spec it added. The Accept header is
// split at "," into entries and each entry at ";" (whitespace trimmed); an
// entry without "/" is dropped; only the first version=… that parses as a
// full semver (X.Y.Z, github.com/coreos/go-semver) and the first q=… that
// parses as a float count, keys are case-sensitive, q defaults to 1 and
// q=0 is not special. Entries are stably sorted by descending q and the
// first entry whose subtype is vnd.coreos.ignition+json (the type before
// "/" is not checked) and that has a version decides:
//
//	requested version            served
//	[2.2.0, 3.0.0)               2.2.0
//	[3.1.0, 3.2.0)               3.1.0
//	[3.2.0, 3.3.0)               3.2.0
//	[3.3.0, 3.4.0)               3.3.0
//	[3.4.0, 3.5.0)               3.4.0
//	[3.5.0, 4.0.0)               3.5.0 (newer 3.x gets the newest supported)
//	< 2.2.0, [3.0.0, 3.1.0),     not servable: remembered, the next entry is
//	≥ 4.0.0                      tried; if none is servable → error
//	                             (ErrUnsupportedVersion; the server answers 400)
//
// With no Ignition entry carrying a valid version the answer is 2.2.0, so
// curl and browsers get what they always got. Pre-releases compare below
// their release (3.5.0-rc → 3.4.0, 3.6.0-experimental → 3.5.0). Examples
// (each is a case of TestNegotiate):
//
//	Accept                                                       served
//	(none)                                                       2.2.0
//	*/*                                  (curl)                  2.2.0
//	text/plain, garbage-without-slash                            2.2.0
//	application/vnd.coreos.ignition+json (no version)            2.2.0
//	application/vnd.coreos.ignition+json;version=3.5   (not X.Y.Z: ignored) 2.2.0
//	application/vnd.coreos.ignition+json;version=3.5.0, */*;q=0.1
//	                                     (current Ignition)      3.5.0
//	application/vnd.coreos.ignition+json;version=3.4.0, */*;q=0.1 3.4.0
//	application/vnd.coreos.ignition+json; version=2.4.0, application/vnd.coreos.ignition+json; version=1; q=0.5, */*; q=0.1
//	                                     (Ignition 0.x)          2.2.0
//	…;version=2.2.0 / 2.4.0                                      2.2.0
//	…;version=2.1.0 / 3.0.0 / 4.0.0                              error
//	…;version=3.6.0 / 3.99.0                                     3.5.0
//	…;version=4.0.0, …;version=3.2.0;q=0.5                       3.2.0
//	…;version=3.1.0;q=0.2, …;version=3.4.0;q=0.9                 3.4.0
//	…;version=3.1.0;q=bogus (q ignored → 1), …;version=3.4.0;q=0.9 3.1.0
//
// # Translation
//
// Rendered MachineConfigs hold spec 3.x (current MCOs 3.5, older 3.2 or
// 3.4; ancient ones 2.2). ParseConfig reads any of them into spec 3.5 with
// Ignition's ParseCompatibleVersion (2.x through ign-converter v23tov30,
// as the MCO's ParseAndConvertConfig does). Translate writes spec v:
// 3.5 as is; 3.4 by translate35to34 (Ignition's reflective translator;
// LUKS cex, the one 3.5 addition, is refused when enabled — the
// ign-converter the MCO pins has no v35tov34; the newer one 3.5-era MCOs
// use does the same copy but also drops tang advertisement, a 3.4 field,
// and does not look for cex); 3.3, 3.2, 3.1 by ign-converter v34tov33,
// v33tov32, v32tov31; 2.2 by ign-converter v32tov22 from 3.2, the chain
// the MCO uses. A field the older spec cannot express is an ErrTranslate,
// never silently dropped. For clients older than 3.3, the full tier first
// moves Ignition kernelArguments into the encapsulated MachineConfig, as
// the MCS does.
//
// # What is served
//
// A Renderer is built from Inputs (NewInputs, or LoadBootstrapDir for the
// MCO bootstrap directory) and Options, is immutable, and renders each
// pool × tier × version once, on first use (Prerender does all at once).
//
// TierFull is what the MCS serves: the rendered MachineConfig the pool
// names (spec.configuration.name once status.updatedMachineCount > 0,
// else status.configuration.name, as the in-cluster MCS chooses; the
// bootstrap MCS reads status, which the MCO bootstrap writes equal to
// spec), plus the MCS's files, appended in its order (see buildFull):
// the kubelet CA and cloud provider CA from the ControllerConfig
// (replacing the contents of an existing file at that path),
// /etc/machine-config-daemon/node-annotations.json,
// /etc/kubernetes/kubeconfig, /etc/mcs-machine-config-content.json,
// bootstrap registry CAs, and /etc/ignition-machine-config-encapsulated.json.
// Differences from the MCS, all deliberate: JSON is written with
// encoding/json, while the MCS writes the down-translated configs and the
// two serialised MachineConfigs with clarketm/json, which also omits empty
// objects — the same JSON values, different bytes; the bootstrap MCS
// serves only the master pool and encapsulates a 3.x empty config even for
// 2.2 clients, while nodeproof serves every pool of the directory and
// encapsulates by the served version, as the in-cluster MCS does.
//
// TierPublic holds only the pool's source MachineConfigs marked with
// NeededBeforeNodeApprovedAnnotation (see publicSources), merged in name
// order with Ignition's merge, plus Options.PublicExtra; it refuses to
// build (ErrSecretInPublicTier) if any of them writes a file in
// ForbiddenPublicPaths.
//
// In cluster mode every node gets its own kubeconfig: FullWithKubeconfig
// splices it into the once-rendered full tier instead of re-rendering.
package render
