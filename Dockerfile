# rkubelet as an image, for nodes that run their agent from an image (e.g. a kind node
# image that replaces its kubelet). Build: `docker build -t rkubelet .`
# Run on the node with the host's namespaces and directories:
#   docker run --privileged --pid=host --network=host \
#     -v /run/containerd:/run/containerd -v /var/lib/rkubelet:/var/lib/rkubelet \
#     -v /var/log/pods:/var/log/pods -v /etc/cni/net.d:/etc/cni/net.d -v /opt/cni/bin:/opt/cni/bin \
#     -v /etc/rkubelet:/etc/rkubelet rkubelet run --kubeconfig /etc/rkubelet/kubeconfig ...
FROM docker.io/library/rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
RUN cargo build --locked --release --bin rkubelet

FROM docker.io/library/debian:bookworm-slim
# iptables for the portmap plugin; the standard CNI plugins for agent-owned networking.
RUN apt-get update && apt-get install -y --no-install-recommends iptables containernetworking-plugins ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/rkubelet /usr/bin/rkubelet
COPY cni-config/10-rkubelet.conflist /etc/rkubelet/cni/net.d/10-rkubelet.conflist
ENTRYPOINT ["/usr/bin/rkubelet"]
CMD ["--help"]
