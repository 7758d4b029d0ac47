#!/usr/bin/env bash
# progress.sh LABEL COMMAND [ARG...]: COMMAND, with a line every 30 s that
# it is still running (hack/lib/progress.sh). Exits with COMMAND's status.
set -uo pipefail
# shellcheck source=lib/progress.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"
with_progress "$@"
