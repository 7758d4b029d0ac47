#!/bin/busybox sh
# /init of the live boot's initramfs (internal/liveboot): a node's first
# boot and every later one, as far as nodeproof is concerned.
#
#   first boot (nothing enrolled on the data disk): the agent attests and
#     writes the full config for Ignition (--mode pointer); Ignition's
#     fetch stage runs with the platform's pointer config; kubelet-csr
#     makes the kubelet's client CSR with the kubeconfig the config carried
#     and waits for the approver's decision (or, in an initramfs with the
#     kubelet and containerd, the real kubelet bootstraps, registers its
#     Node and gets its serving certificate: kubelet_bootstrap below); then
#     the agent re-attests once, as the node's timer would in this boot;
#   every later boot: the agent re-attests (--mode reattest).
#
# The host says per boot (QEMU fw_cfg opt/nodeproof/plan) whether the
# agent runs at all ("none": the boot without it, for the benchmark).
# Lines starting "nodeproof-liveboot:" are for the host to read, each with
# the guest's uptime. /var/lib persists on the data disk (/dev/vdb, a tar
# archive), and what the host reads back goes there too: the event log and
# the PCRs as the kernel shows them.
/bin/busybox mkdir -p /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t securityfs securityfs /sys/kernel/security
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp

mark() { echo "nodeproof-liveboot: $* [uptime $(cut -d' ' -f1 /proc/uptime)]"; }
mark init
for m in $(cat /etc/nodeproof/modules); do
	insmod "/lib/modules/$m" || mark "insmod $m failed"
done
mount -t efivarfs efivarfs /sys/firmware/efi/efivars || mark "no efivarfs"
. /etc/nodeproof/liveboot.env
plan=$(cat /sys/firmware/qemu_fw_cfg/by_name/opt/nodeproof/plan/raw 2>/dev/null)
hostname "$NP_NODE"
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up

# /var/lib from the data disk (an empty disk reads as an empty archive).
mkdir -p /var/lib /usr/lib/ignition
tar -xf /dev/vdb -C / var/lib 2>/dev/null
rm -rf /var/lib/liveboot
mkdir -p /var/lib/liveboot

# What the firmware told the kernel.
# The variable is 4 bytes of attributes, then its one byte of data.
sb=$(tail -c 1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c 2>/dev/null | od -An -tu1 | tr -d ' ')
mark "secure-boot ${sb:-unknown}"
log=/sys/kernel/security/tpm0/binary_bios_measurements
if [ -e "$log" ]; then
	cat "$log" >/var/lib/liveboot/eventlog.bin
	mark "event-log $(wc -c </var/lib/liveboot/eventlog.bin) bytes"
else
	mark "event-log missing"
fi
for i in $(seq 0 23); do
	echo "$i $(cat /sys/class/tpm/tpm0/pcr-sha256/$i)"
done >/var/lib/liveboot/pcr-sha256

# kubelet_bootstrap runs the node's kubelet bootstrap as deploy/node does
# it, with the bootstrap kubeconfig the attested config carried
# (/etc/kubernetes/kubeconfig):
#   1. `nodeproof-agent kubelet-bootstrap` (nodeproof-kubelet-bootstrap.
#      service): the kubelet's client CSR with the key the agent bound into
#      its evidence; `nodeproof approve` approves it, kube-controller-
#      manager signs it, and the agent writes kubelet-client-current.pem
#      and the kubelet's kubeconfig;
#   2. the real kubelet with --rotate-certificates=true and
#      --rotate-server-certificates (OpenShift's kubelet.conf), on Debian's
#      containerd: it finds that certificate valid and makes no bootstrap
#      CSR; it registers its Node (InternalIP 10.0.2.15, Hostname the node
#      name) and its serving certificate manager asks for a serving
#      certificate with those addresses, which `nodeproof approve` judges
#      against the addresses the evidence attested; past its rotation
#      deadline (kube-controller-manager signs for 40 s) its client
#      certificate manager renews with a new key of its own, authenticated
#      by the first certificate. Once both certificates are written the
#      kubelet and containerd are stopped (no pod runs: the node has no
#      network plugin and stays NotReady).
kubelet_bootstrap() {
	pki=/var/lib/kubelet/pki
	mkdir -p /etc/kubernetes $pki
	kubelet-csr --ignition-config /run/ignition.json --print-file /etc/kubernetes/kubeconfig >/etc/kubernetes/kubeconfig || return 1
	cp $pki/kubelet-client.key.tmp /run/agent-kubelet.key || return 1
	mark "agent kubelet-bootstrap start"
	nodeproof-agent kubelet-bootstrap --node-name "$NP_NODE" --timeout 120s || { mark "agent kubelet-bootstrap failed"; return 1; }
	mark "agent kubelet-bootstrap exit 0"
	cat $pki/kubelet-client-current.pem >/var/lib/liveboot/kubelet-client-bootstrap.pem
	kubelet-csr --check-cert $pki/kubelet-client-current.pem --key /run/agent-kubelet.key --node "$NP_NODE" || return 1
	mark "kubelet start (rotate-certificates true, containerd)"
	mkdir -p /sys/fs/cgroup /run/containerd /var/lib/containerd
	mount -t cgroup2 cgroup2 /sys/fs/cgroup || mark "no cgroup2"
	containerd --config /etc/containerd/config.toml >/run/containerd.log 2>&1 &
	ctrd=$!
	i=0
	while [ ! -S /run/containerd/containerd.sock ] && [ $i -lt 60 ]; do sleep 1; i=$((i + 1)); done
	[ -S /run/containerd/containerd.sock ] || { mark "containerd not serving after 60 s"; tail -n 20 /run/containerd.log; return 1; }
	mark "containerd serving"
	client=$(sha256sum <$pki/kubelet-client-current.pem)
	kubelet --bootstrap-kubeconfig=/etc/kubernetes/kubeconfig --kubeconfig=/var/lib/kubelet/kubeconfig \
		--cert-dir=$pki --hostname-override="$NP_NODE" --node-ip=10.0.2.15 --rotate-server-certificates --v=2 \
		--rotate-certificates=true --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
		--cgroups-per-qos=false --enforce-node-allocatable= --fail-swap-on=false >/run/kubelet.log 2>&1 &
	kpid=$!
	# Until the serving certificate is written and the client one renewed
	# (or the kubelet stopped, or two minutes passed).
	i=0
	while [ $i -lt 120 ] && kill -0 $kpid 2>/dev/null; do
		[ -e $pki/kubelet-server-current.pem ] && [ "$(sha256sum <$pki/kubelet-client-current.pem)" != "$client" ] && break
		sleep 1
		i=$((i + 1))
	done
	if [ -e $pki/kubelet-server-current.pem ] && [ "$(sha256sum <$pki/kubelet-client-current.pem)" != "$client" ]; then
		mark "kubelet: serving certificate written, client certificate renewed; stopping it"
	fi
	kill $kpid 2>/dev/null
	wait $kpid
	mark "kubelet exit $?"
	kill $ctrd
	wait $ctrd
	grep -E 'bootstrap|Bootstrap|rotat|Rotat|certificate|Certificate|failed to run Kubelet|Successfully registered node|Unable to register' /run/kubelet.log | cut -c1-300 | head -n 30
	[ -e $pki/kubelet-server-current.pem ] || { mark "kubelet wrote no serving certificate"; grep -E '^E' /run/kubelet.log | cut -c1-400 | tail -n 20; tail -n 10 /run/containerd.log; }
	cat $pki/kubelet-server-current.pem >/var/lib/liveboot/kubelet-server.pem
	cat $pki/kubelet-client-current.pem >/var/lib/liveboot/kubelet-client-renewed.pem
	kubelet-csr --check-cert $pki/kubelet-client-current.pem --key /run/agent-kubelet.key --node "$NP_NODE"
}

agent() {
	nodeproof-agent --server "$NP_SERVER" --ca-bundle /etc/nodeproof/mcs-ca-bundle.crt \
		--pool "$NP_POOL" --node-name "$NP_NODE" --evidence tpm --timeout 120s "$@"
}

if [ "$plan" = none ]; then
	mark "agent not run (plan none)"
elif [ -e /var/lib/nodeproof/enrolled ]; then
	mark "agent reattest start"
	agent --mode reattest
	mark "agent exit $?"
else
	mark "agent pointer start"
	agent --mode pointer --ignition-dir /usr/lib/ignition
	rc=$?
	mark "agent exit $rc"
	if [ $rc = 0 ] && [ -x /bin/ignition ]; then
		mark "ignition fetch start"
		mkdir -p /run/ignition
		IGNITION_CONFIG_FILE=/etc/nodeproof/pointer.ign IGNITION_SYSTEM_CONFIG_DIR=/usr/lib/ignition TMPDIR=/run/ignition \
			ignition -platform file -stage fetch -config-cache /run/ignition.json \
			-state-file /run/ignition/state -neednet /run/ignition/neednet -root /run/ignition/root -log-to-stdout 2>&1 |
			grep -v '^$' | tail -n 8
		[ -s /run/ignition.json ]
		rc=$?
		mark "ignition exit $rc"
	fi
	if [ $rc = 0 ] && [ -x /bin/kubelet ]; then
		kubelet_bootstrap
		rc=$?
		mark "kubelet bootstrap exit $rc"
	elif [ $rc = 0 ] && [ -x /bin/kubelet-csr ]; then
		mark "kubelet-csr start"
		kubelet-csr --ignition-config /run/ignition.json --node "$NP_NODE"
		rc=$?
		mark "kubelet-csr exit $rc"
	fi
	if [ $rc = 0 ]; then
		mkdir -p /var/lib/nodeproof
		touch /var/lib/nodeproof/enrolled
		# The node's re-attestation timer runs in its first boot too: the
		# server then knows this boot (its TPM reset count).
		mark "agent reattest start (first boot)"
		agent --mode reattest
		mark "agent exit $?"
	fi
fi

tar -cf /dev/vdb -C / var/lib
sync
mark poweroff
poweroff -f
