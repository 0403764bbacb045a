# shellcheck shell=bash
# Shared helpers for the code-generation scripts (sourced, not executed).
#
# The generated files embed the generator's version (jobs_pb2.py checks the
# protobuf runtime against the gencode version, jobs_pb2_grpc.py checks
# grpcio against GRPC_GENERATED_VERSION), so the generator is pinned exactly.
# Bumping it: change the version below, run scripts/generate-stubs, commit
# the result together with matching lower bounds for protobuf / grpcio in
# pyproject.toml.

LEASEHOLD_GRPCIO_TOOLS_VERSION=1.85.1

LEASEHOLD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# codegen_python: set CODEGEN_PYTHON to a Python interpreter that has exactly
# grpcio-tools==$LEASEHOLD_GRPCIO_TOOLS_VERSION installed.
#   1. $PYTHON, then `python`, then `python3` from PATH (normally the active
#      project venv: `pip install -e '.[test]'` installs grpcio-tools);
#   2. otherwise a private venv under .cache/codegen/ (git-ignored) that is
#      created on first use with `pip install grpcio-tools==<pinned>`.
# shellcheck disable=SC2034  # CODEGEN_PYTHON is this function's output
codegen_python() {
  local want="$LEASEHOLD_GRPCIO_TOOLS_VERSION" c have
  local -a candidates=()
  [[ -n "${PYTHON:-}" ]] && candidates+=("$PYTHON")
  candidates+=(python python3)
  for c in "${candidates[@]}"; do
    command -v "$c" >/dev/null 2>&1 || continue
    have="$("$c" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))' 2>/dev/null || true)"
    if [[ "$have" == "$want" ]]; then
      CODEGEN_PYTHON="$(command -v "$c")"
      return 0
    fi
  done

  local cache="${LEASEHOLD_CODEGEN_CACHE:-$LEASEHOLD_ROOT/.cache/codegen}"
  local venv="$cache/grpcio-tools-$want"
  mkdir -p "$cache"
  # buf runs plugins in parallel; serialise the one-time bootstrap.
  if command -v flock >/dev/null 2>&1; then
    exec {__codegen_lock}>"$cache/.lock"
    flock "$__codegen_lock"
  fi
  if [[ ! -f "$venv/.complete" ]]; then
    echo "codegen: no python with grpcio-tools==$want on PATH;" \
         "creating ${venv#"$LEASEHOLD_ROOT"/} (one-time)" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet \
      "grpcio-tools==$want" >&2
    touch "$venv/.complete"
  fi
  if [[ -n "${__codegen_lock:-}" ]]; then
    exec {__codegen_lock}>&-
    unset __codegen_lock
  fi
  CODEGEN_PYTHON="$venv/bin/python"
}

# The Go generators are Debian bookworm's (apt-get install protoc-gen-go
# protoc-gen-go-grpc), pinned like grpcio-tools: the .pb.go files name
# protoc-gen-go's version, so another release would rewrite every file.
LEASEHOLD_PROTOC_GEN_GO_VERSION="protoc-gen-go v1.28.1"
LEASEHOLD_PROTOC_GEN_GO_GRPC_VERSION="protoc-gen-go-grpc 1.0"

# codegen_go_plugins: return 0 when protoc-gen-go and protoc-gen-go-grpc of the
# pinned versions are on PATH; otherwise set CODEGEN_GO_MISSING to what is
# wrong and return 1.
# shellcheck disable=SC2034  # CODEGEN_GO_MISSING is this function's output
codegen_go_plugins() {
  local plugin want have
  CODEGEN_GO_MISSING=""
  for plugin in protoc-gen-go protoc-gen-go-grpc; do
    if [[ $plugin == protoc-gen-go ]]; then
      want="$LEASEHOLD_PROTOC_GEN_GO_VERSION"
    else
      want="$LEASEHOLD_PROTOC_GEN_GO_GRPC_VERSION"
    fi
    if ! command -v "$plugin" >/dev/null 2>&1; then
      CODEGEN_GO_MISSING+="${CODEGEN_GO_MISSING:+; }$plugin is not on PATH"
      continue
    fi
    have="$("$plugin" --version 2>/dev/null || true)"
    if [[ "$have" != "$want" ]]; then
      CODEGEN_GO_MISSING+="${CODEGEN_GO_MISSING:+; }$plugin is '$have', not '$want'"
    fi
  done
  [[ -z "$CODEGEN_GO_MISSING" ]]
}
