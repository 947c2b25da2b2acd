#!/usr/bin/env bash
# What a submission of the commits BASE..HEAD would weigh, against the two limits a submission must stay under:
#   packed: the new objects as git sends them (a thin pack over BASE), at most 512 MiB;
#   diffs:  the diffs of every commit added up as text (binary files as `git log -p --binary` writes them), at most
#           256 MiB. A file committed in several commits counts each time: the thirty-fifth session committed the
#           37 MiB grid store eight times and was refused (benchmarks/stores now takes deltas: cudal2 store delta).
#   bash scripts/submission_size.sh [BASE]   (default: the last commit older than 4 hours, as the before-stop hook)
# Exit 0 under both limits, 1 over either, 2 on bad usage. LIMIT_PACKED_MIB / LIMIT_DIFFS_MIB move the limits (tests).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
base=${1:-$(git rev-list -1 --before='4 hours ago' HEAD)}
git rev-parse --verify -q "$base^{commit}" >/dev/null || { echo "submission_size.sh: not a commit: $base" >&2; exit 2; }
packed=$(printf 'HEAD\n^%s\n' "$base" | git pack-objects --revs --thin --stdout -q | wc -c)
diffs=$(git log -p --binary --format= "$base..HEAD" | wc -c)
commits=$(git rev-list --count "$base..HEAD")
max_packed=${LIMIT_PACKED_MIB:-512} max_diffs=${LIMIT_DIFFS_MIB:-256}
mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
echo "$commits commits since $(git rev-parse --short "$base"): packed $(mib "$packed") (limit $max_packed)," \
  "diffs $(mib "$diffs") (limit $max_diffs)"
if ((packed > max_packed * 1048576 || diffs > max_diffs * 1048576)); then
  echo "over a limit: the submission would be refused whole" >&2
  exit 1
fi
