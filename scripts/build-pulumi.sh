#!/usr/bin/env bash
# Builds the real Pulumi binaries from the Go module proxy into a cache outside the repository,
# keyed by the pinned versions, and puts `pulumi` on PATH (/usr/local/bin). Idempotent: a cached
# build is reused and only the probe runs again.
#
# First it probes every row of scripts/pulumi-build/modules.tsv and says, per binary, which
# module version the proxy serves and, for those it refuses, the proxy's own answer. Then it
# builds each binary from its first served row. What is built is exactly what the pins name:
# go.mod and go.sum (glue of ours, no Pulumi code) pin the CLI and every module it needs.
#
# Environment: SPARK_VLLM_CACHE (default /var/cache/spark-vllm), PULUMI_BIN_DIR (where the
# `pulumi` link goes, default /usr/local/bin).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
glue="$here/pulumi-build"
cache_root="${SPARK_VLLM_CACHE:-/var/cache/spark-vllm}/pulumi"
bin_dir="${PULUMI_BIN_DIR:-/usr/local/bin}"
probe_timeout=30

# Go's own install directory is not on every non-interactive PATH.
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build-pulumi: no Go toolchain on PATH (Go 1.26.6 or newer)" >&2; exit 1; }
# The glue needs no newer Go than the machine's; never let a go.mod line fetch another toolchain.
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

# Release builds' flags (pulumi/pulumi .goreleaser.yml): static, no cgo, no gRPC tracing.
cli_version="$(awk -F'\t' '$1 == "pulumi" {split($2, m, "@"); print m[2]; exit}' "$glue/modules.tsv")"
build_flags=(-trimpath -tags "osusergo,grpcnotrace"
  -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$cli_version")
key="$( { cat "$glue/go.mod" "$glue/go.sum"; printf '%s\n' "${build_flags[@]}"; go version; } \
  | sha256sum | cut -c1-16)"
out="$cache_root/$cli_version-$key"

# -- the probe ------------------------------------------------------------------------------
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
printf 'module probe\n\ngo 1.26\n' >"$probe_dir/go.mod"
declare -A chosen=()
report="$probe_dir/probe.txt"
echo "build-pulumi: what the Go module proxy serves of the pinned binaries" | tee "$report"
unanswered=""
while IFS=$'\t' read -r binary module why; do
  [[ -z $binary || $binary == \#* ]] && continue
  if [[ -n $unanswered ]]; then  # one probe that hung is enough: do not wait on every row
    printf '  %-24s %s: not probed (%s)\n' "$binary" "$module" "$unanswered" | tee -a "$report"
    continue
  fi
  status=0
  answer="$(cd "$probe_dir" || exit
    GOFLAGS=-mod=mod timeout "$probe_timeout" go mod download -json "$module" 2>&1)" || status=$?
  if ((status == 124)); then
    unanswered="the proxy did not answer within ${probe_timeout}s"
    printf '  %-24s %s: NO ANSWER within %ss\n' "$binary" "$module" "$probe_timeout" | tee -a "$report"
  elif grep -q '"Error"' <<<"$answer" || ! grep -q '"Zip"' <<<"$answer"; then
    # The proxy's own sentence ("403 Forbidden ... not available"), or what else went wrong.
    reason="$(grep -o '"Error": "[^"]*' <<<"$answer" | sed 's/"Error": "//; s/\\n\\t/ /g; s/\\n/ /g' \
      | sed 's/.*: reading https:[^ ]*: //' | head -c 200)"
    [[ -n $reason ]] || reason="$(tail -n 1 <<<"$answer" | head -c 200)"
    printf '  %-24s %s: NOT SERVED (%s) [%s]\n' "$binary" "$module" "$reason" "$why" | tee -a "$report"
  else
    printf '  %-24s %s: served [%s]\n' "$binary" "$module" "$why" | tee -a "$report"
    [[ -n ${chosen[$binary]:-} ]] || chosen[$binary]=$module
  fi
done <"$glue/modules.tsv"

# -- the builds -----------------------------------------------------------------------------
if [[ -x $out/bin/pulumi ]]; then
  echo "build-pulumi: pulumi $cli_version cached in $out"
else
  [[ -n ${chosen[pulumi]:-} ]] || {
    echo "build-pulumi: pulumi $cli_version is not cached, and the proxy did not serve it" \
      "(above): cannot build the CLI" >&2
    exit 1
  }
  echo "build-pulumi: building pulumi $cli_version (a cold build takes minutes on two cores)"
  started=$SECONDS
  mkdir -p "$out/bin.partial"
  (cd "$glue" && go build "${build_flags[@]}" -o "$out/bin.partial/pulumi" \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
  rm -rf "${out:?}/bin" && mv "$out/bin.partial" "$out/bin"
  echo "build-pulumi: built pulumi in $((SECONDS - started))s"
fi
cp "$report" "$out/probe.txt"
for binary in pulumi-language-python pulumi-resource-command pulumi-resource-docker; do
  if [[ -n ${chosen[$binary]:-} ]]; then
    # Served now, where it was not when this was written: say so loudly, build nothing unknown.
    echo "build-pulumi: NOTE: ${chosen[$binary]} is served now; add its build here" \
      "(see docs/testing.md, 'The real Pulumi') to retire its stand-in" >&2
  else
    echo "build-pulumi: $binary: no served version; the lab plays it (docs/testing.md, 'The real Pulumi')"
  fi
done

mkdir -p "$bin_dir"
ln -sfn "$out/bin/pulumi" "$bin_dir/pulumi"
"$bin_dir/pulumi" version
