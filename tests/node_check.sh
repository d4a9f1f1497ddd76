# Shared by the ctests that run a Node.js package against nabla (sourced):
# fail MESSAGE, and npm_install DIR [NPM ARGS] which installs DIR's pinned
# packages into DIR/node_modules when missing or older than the lock file.
# These tests fail, never skip, when Node.js, npm or the registry is missing:
# a check that cannot run has not passed.
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

command -v node >/dev/null 2>&1 || fail "node is not installed (scripts/install-deps installs nodejs and npm)"
command -v npm >/dev/null 2>&1 || fail "npm is not installed (scripts/install-deps installs nodejs and npm)"

npm_install() {  # DIR [npm args]: `npm ci` unless args are given
  npm_dir=$1
  shift
  if [ ! -f "$npm_dir/node_modules/.package-lock.json" ] ||
     [ "$npm_dir/package-lock.json" -nt "$npm_dir/node_modules/.package-lock.json" ]; then
    echo "installing $(basename "$npm_dir")'s npm packages into $npm_dir/node_modules"
    if [ $# -eq 0 ]; then set -- ci --ignore-scripts; fi
    (cd "$npm_dir" && npm "$@" --no-audit --no-fund) || fail "npm could not install into $npm_dir: is the npm registry reachable?"
  fi
}
