# shellcheck shell=bash
# The VM node's image (`image.sh build-vm-node`; sourced by scripts/image.sh, whose base
# helpers it uses): a Debian 12 root file system as an ext4 disk, with the kernel and an
# initramfs to boot it directly (`qemu -kernel -initrd`), made once and cached under
# $VM_IMAGE_DIR, remade when its recipe changes:
#   disk.img      raw ext4 (mkfs.ext4 -d: nothing is mounted), $VM_DISK_SIZE: Debian
#                 bookworm minbase with systemd, udev, dbus, containerd + runc, the CNI
#                 plugins, iptables, iproute2, an SSH server, curl and
#                 linux-image-cloud-amd64; containerd configured as on the kind-style node
#                 (packaging/kind-node/: the systemd cgroup driver, the local registry
#                 through hosts.toml, the runtime's CNI template); rkubelet's
#                 kubelet.service + 10-kubeadm.conf enabled, waiting for kubeadm's files
#                 as the kubelet package does. rkubelet itself is not in it: each node's
#                 disk gets the binary under test (cluster/vm-node.sh).
#   vmlinuz, initrd.img   the cloud kernel and an initramfs with the virtio PCI and block
#                 modules (the cloud kernel has them as modules; ext4 is built in).
#   ssh/          the key the scripts log in with (made once, kept across rebuilds) and
#                 the image's host key as known_hosts entry `rkubelet-vm-node`.
# The debootstrap tarball is image.sh's (rkubelet-vm-base), so a change of the steps or
# files below remakes the disk in about a minute without the mirror.

VM_DISK_SIZE="4G"

# What makes the Debian root file system ROOT a VM node (run on the host, in chroot ROOT):
# - an initramfs that loads only the virtio drivers (PCI, block, and the network's, so
#   that eth0 is there when systemd-networkd starts, not once udev gets to it);
# - the root file system by device, systemd-networkd configured from the kernel command
#   line's `ip=` (systemd-network-generator), so each node's address is its boot's, IPv4
#   only (network-online.target, which kubelet.service waits for, then comes as soon as
#   the address is set, not after IPv6 link-local addressing);
# - the CNI plugins also at /opt/cni/bin (containerd's default, as on a kind node);
# - containerd as on the kind-style node, but with oom_score_adj as the kubelet sets it:
#   in a VM root may lower it (the kind node's container may not);
# - no getty (the console is a log file), no timers that would run apt or fsck jobs in
#   the middle of a test, no loading of modules nothing here uses (loop, fuse, device
#   mapper, EFI pstore: each a process, and processes are slow under emulation),
#   multi-user as the default target, no machine ID (each node makes its own at first
#   boot);
# - rkubelet's kubelet.service and kubeadm drop-in, and its own CNI config, as the
#   Dockerfile's `node` stage installs them; the kubelet enabled;
# - root logs in over SSH with the scripts' key only.
vm_base_steps() {
  local root=$1 pubkey=$2
  printf 'virtio_pci\nvirtio_blk\nvirtio_net\n' >"$root/etc/initramfs-tools/modules"
  sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
  chroot "$root" update-initramfs -u -k all >/dev/null 2>&1
  printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
  mkdir -p "$root/etc/systemd/network/90-eth0.network.d"
  printf '[Network]\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' \
    >"$root/etc/systemd/network/90-eth0.network.d/ipv4-only.conf"
  mkdir -p "$root/opt/cni"
  ln -sfn /usr/lib/cni "$root/opt/cni/bin"
  sed -i 's/^\([[:space:]]*restrict_oom_score_adj = \).*/\1false/' "$root/etc/containerd/config.toml"
  install -D -m 0644 "$RKUBELET_REPO/packaging/systemd/kubelet.service" "$root/lib/systemd/system/kubelet.service"
  install -D -m 0644 "$RKUBELET_REPO/packaging/systemd/10-kubeadm.conf" \
    "$root/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
  install -D -m 0644 "$RKUBELET_REPO/cni-config/10-rkubelet.conflist" "$root/etc/rkubelet/cni/net.d/10-rkubelet.conflist"
  install -d -m 0700 "$root/root/.ssh"
  install -m 0600 "$pubkey" "$root/root/.ssh/authorized_keys"
  chroot "$root" sh -ec '
    systemctl enable containerd.service ssh.service kubelet.service systemd-networkd.service \
      systemd-network-generator.service
    systemctl disable apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
      e2scrub_all.timer fstrim.timer e2scrub_reap.service getty@tty1.service
    systemctl mask getty.target serial-getty@ttyS0.service systemd-timesyncd.service \
      systemd-firstboot.service systemd-pstore.service modprobe@loop.service \
      modprobe@fuse.service modprobe@dm_mod.service modprobe@efi_pstore.service
    systemctl set-default multi-user.target
    : >/etc/machine-id
  ' >/dev/null 2>&1
}

# The recipe of the disk: the tarball's, the steps above, and every file they copy in.
vm_recipe() {
  local tarball_recipe=$1 pubkey=$2
  {
    echo "$tarball_recipe $VM_DISK_SIZE"
    declare -f vm_base_steps
    tar --create --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
      --directory="$BASE_FILES" . | sha256sum
    cat "$RKUBELET_REPO/packaging/systemd/kubelet.service" "$RKUBELET_REPO/packaging/systemd/10-kubeadm.conf" \
      "$RKUBELET_REPO/cni-config/10-rkubelet.conflist" "$pubkey"
  } | sha256sum | cut -d' ' -f1
}

# The scripts' SSH key, made once.
ensure_vm_key() {
  local key="$VM_IMAGE_DIR/ssh/id_ed25519"
  [[ -f $key && -f $key.pub ]] && return 0
  install -d -m 0700 "$VM_IMAGE_DIR/ssh"
  rm -f "$key" "$key.pub"
  ssh-keygen -q -t ed25519 -N '' -C "rkubelet scripts" -f "$key"
}

cmd_build_vm() {
  local start=$SECONDS recipe tarball_recipe root pubkey kernel
  [[ $(id -u) -eq 0 ]] || die "build-vm-node must run as root (debootstrap, chroot)"
  command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 is needed (apt-get install e2fsprogs)"
  umask 022
  use_base vm
  mkdir -p "$VM_IMAGE_DIR"
  # One build at a time; a node being added waits for the build to finish.
  exec 9>"$VM_IMAGE_DIR/.lock"
  flock 9
  ensure_vm_key
  pubkey="$VM_IMAGE_DIR/ssh/id_ed25519.pub"
  tarball_recipe=$(base_recipe)
  recipe=$(vm_recipe "$tarball_recipe" "$pubkey")
  if [[ -f $VM_IMAGE_DIR/disk.img && $(cat "$VM_IMAGE_DIR/recipe" 2>/dev/null) == "$recipe" ]]; then
    log "vm node image: $VM_IMAGE_DIR is up to date"
    return 0
  fi
  ensure_base_tarball "$tarball_recipe"
  log "vm node image: disk, kernel and initramfs from $BASE_TARBALL"
  WORK_DIR=$(mktemp -d "$VM_IMAGE_DIR/build.XXXXXX")
  root="$WORK_DIR/rootfs"
  mkdir "$root"
  tar --extract --gzip --file="$BASE_TARBALL" --directory="$root" --numeric-owner --xattrs
  cp -a "$BASE_FILES/." "$root/"
  vm_base_steps "$root" "$pubkey" || die "the VM node's set-up steps failed"
  kernel=$(find "$root/boot" -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n 1)
  [[ -n $kernel && -f $root/boot/initrd.img-${kernel##*/vmlinuz-} ]] || die "no kernel or initramfs in the VM image"
  cp "$kernel" "$WORK_DIR/vmlinuz"
  cp "$root/boot/initrd.img-${kernel##*/vmlinuz-}" "$WORK_DIR/initrd.img"
  printf '%s %s\n' "$VM_HOST_KEY_ALIAS" "$(cut -d' ' -f1,2 "$root/etc/ssh/ssh_host_ed25519_key.pub")" \
    >"$WORK_DIR/known_hosts"
  mkfs.ext4 -q -F -L rkubelet-vm -d "$root" "$WORK_DIR/disk.img" "$VM_DISK_SIZE" >/dev/null
  rm -f "$VM_IMAGE_DIR/recipe"
  mv "$WORK_DIR/disk.img" "$WORK_DIR/vmlinuz" "$WORK_DIR/initrd.img" "$VM_IMAGE_DIR/"
  mv "$WORK_DIR/known_hosts" "$VM_IMAGE_DIR/ssh/known_hosts"
  echo "$recipe" >"$VM_IMAGE_DIR/recipe"
  rm -rf --one-file-system "$WORK_DIR"
  WORK_DIR=""
  log "vm node image: $VM_IMAGE_DIR ($(du -sh --apparent-size "$VM_IMAGE_DIR/disk.img" | cut -f1) disk," \
    "$(du -sh "$VM_IMAGE_DIR/disk.img" | cut -f1) used), kernel ${kernel##*/vmlinuz-}, in $((SECONDS - start)) s"
}

# Removes the VM image and its cached root file system (the SSH key stays).
cmd_clean_vm() {
  use_base vm
  rm -f "$BASE_TARBALL" "$BASE_TARBALL.recipe" "$VM_IMAGE_DIR"/{disk.img,vmlinuz,initrd.img,recipe}
  log "removed the VM node image and $BASE_TARBALL"
}
