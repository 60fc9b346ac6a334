#!/bin/bash
# The Java conformance CLI (see README.md, "Conformance"), built on first use:
#   client/java/conformance.sh hold --target 127.0.0.1:8700 --key jobs/x --limit 3 --seconds 30
#   client/java/conformance.sh hold --target 127.0.0.1:8700 --key jobs/x --mode read|write
#   client/java/conformance.sh hold --target 127.0.0.1:8700 --key a --also b --also c
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cp="$(make -s -C "$here" classpath)"
exec java -cp "$cp" io.lockbroker.conformance.Main "$@"
