#!/usr/bin/env bash
# Makes sure the client tests (go test ./clients) can run: protoc with the
# well-known types and the gRPC plugins for Python and Java (the stubs'
# staleness checks regenerate them), Debian's python3 with grpcio and
# protobuf (the Python client's test), and javac with the grpc-java and
# protobuf-java jars (the Java client's test). If something is missing and
# apt-get can run (root, Debian/Ubuntu), installs the Debian packages that
# bring it; otherwise says exactly what to do and fails.
set -uo pipefail

PACKAGES="protobuf-compiler libprotobuf-dev protobuf-compiler-grpc python3-grpcio python3-protobuf protobuf-compiler-grpc-java-plugin libgrpc-java libprotobuf-java libnetty-java libperfmark-java libgeronimo-annotation-1.3-spec-java default-jdk-headless"

present() {
	command -v protoc >/dev/null && [ -f /usr/include/google/protobuf/duration.proto ] &&
		command -v grpc_python_plugin >/dev/null && command -v grpc_java_plugin >/dev/null &&
		/usr/bin/python3 -c 'import grpc, google.protobuf' >/dev/null 2>&1 &&
		command -v javac >/dev/null && command -v java >/dev/null &&
		for j in grpc-stub grpc-netty protobuf guava netty-codec-http2 perfmark-api geronimo-annotation-1.3-spec; do
			[ -f "/usr/share/java/$j.jar" ] || return 1
		done
}

if present; then
	exit 0
fi
echo "the client tests need protoc, the gRPC plugins, python3-grpcio and grpc-java; installing the Debian packages..."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	# shellcheck disable=SC2086 # PACKAGES is a list
	if { apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES; } >/tmp/ensure-clients.log 2>&1 && present; then
		echo "client toolchains installed: $(protoc --version), grpcio $(/usr/bin/python3 -c 'import grpc; print(grpc.__version__)'), $(javac -version 2>&1)"
		exit 0
	fi
	echo "installing the client toolchains failed; see /tmp/ensure-clients.log" >&2
fi
cat >&2 <<MSG
The client tests (go test ./clients) need protoc, grpc_python_plugin,
grpc_java_plugin, Debian's python3 with grpcio, and javac with the grpc-java
jars. Install them, then re-run:
  Debian/Ubuntu:  sudo apt-get install $PACKAGES
MSG
exit 1
