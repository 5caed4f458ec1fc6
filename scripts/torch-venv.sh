#!/usr/bin/env bash
# Install one torch release into a venv for the torch scenarios, once:
#   torch-venv.sh DEST REQUIREMENT     (REQUIREMENT: torch==2.15.0, or a wheel's path)
# The venv is built in DEST.partial and renamed to DEST only once torch imports, so a failed or
# interrupted install is never taken for a release (the scenarios find releases by DEST's
# torch/version.py). Debian's /usr/bin/python3 makes it: the container test hosts run the same
# interpreter, so they can use the venv where it is bind-mounted at the same path.
set -euo pipefail
dest="$1"
want="$2"
if [ -x "$dest/bin/python" ] && "$dest/bin/python" -c 'import torch' 2>/dev/null; then
    echo "torch: $dest is installed ($("$dest/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
    exit 0
fi
partial="$dest.partial"
rm -rf "$partial" "$dest"
mkdir -p "$(dirname "$dest")"
echo "torch: installing $want into $dest (about 3 minutes and 5 GB with its CUDA dependencies)"
/usr/bin/python3 -m venv "$partial"
"$partial/bin/pip" install --quiet --disable-pip-version-check "$want" numpy
"$partial/bin/python" -c 'import torch, torch.distributed as d; assert d.is_gloo_available(), "this torch has no Gloo"'
mv "$partial" "$dest"
echo "torch: $dest ready ($("$dest/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
