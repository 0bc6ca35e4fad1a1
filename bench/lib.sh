# Shared by the bench scripts (source it after `cd` to the repository root).

# as_root CMD...: runs CMD as root, through sudo when this shell is not root.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# install_packages PACKAGE...: installs them from Debian.
install_packages() {
  as_root apt-get update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
}

# need_packages CMD:PACKAGE...: installs every PACKAGE whose CMD is not on PATH.
need_packages() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  [ ${#missing[@]} -eq 0 ] || install_packages "${missing[@]}"
}
