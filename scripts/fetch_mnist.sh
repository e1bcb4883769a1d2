#!/usr/bin/env bash
# fetch_mnist.sh [--check] DIR
#
# Makes sure DIR holds the four MNIST files, each raw or gzipped:
#   train-images-idx3-ubyte  train-labels-idx1-ubyte  t10k-images-idx3-ubyte  t10k-labels-idx1-ubyte
# When they are all there it does nothing. Otherwise it downloads the missing .gz files with curl
# from the first mirror that works (MNIST_MIRRORS, a space-separated list of base URLs, overrides
# the default list) and checks the md5 of each decompressed file against the published sums.
# With --check it only looks (also for Fashion-MNIST, which uses the same file names).
# Exits 0 when DIR is ready, non-zero with instructions otherwise.
set -u

FILES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
MIRRORS=${MNIST_MIRRORS:-"https://ossci-datasets.s3.amazonaws.com/mnist/ https://storage.googleapis.com/cvdf-datasets/mnist/"}

# md5 of the decompressed file, as published with the original MNIST distribution
expected_md5() {
    case $1 in
        train-images-idx3-ubyte) echo 6bbc9ace898e44ae57da46a324031adb ;;
        train-labels-idx1-ubyte) echo a25bea736e30d166cdddb491f175f624 ;;
        t10k-images-idx3-ubyte) echo 2646ac647ad5339dbf082846283269ea ;;
        t10k-labels-idx1-ubyte) echo 27ae3e4e09519cfbb04c329615203637 ;;
    esac
}

check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 [--check] DIR" >&2
    exit 2
fi
dir=${1%/}

# the files of FILES that DIR lacks in both forms
missing() {
    local f
    for f in $FILES; do
        [ -f "$dir/$f" ] || [ -f "$dir/$f.gz" ] || echo "$f"
    done
}

todo=$(missing)
if [ -z "$todo" ]; then
    echo "found the four MNIST-format files in $dir"
    exit 0
fi
if [ $check_only = 1 ]; then
    echo "missing in $dir: $(echo "$todo" | tr '\n' ' ')" >&2
    exit 1
fi

give_up() {
    cat >&2 <<EOF
fetch_mnist.sh: $1
MNIST is not in $dir. Either
  - put the four files there, raw or gzipped (.gz):
      train-images-idx3-ubyte  train-labels-idx1-ubyte  t10k-images-idx3-ubyte  t10k-labels-idx1-ubyte
    (for example from https://ossci-datasets.s3.amazonaws.com/mnist/), or
  - use a folder that already has them:  make mnist MNIST_DIR=/path/to/mnist
EOF
    exit 1
}

md5_of_stream() {
    if command -v md5sum >/dev/null; then md5sum | cut -d' ' -f1
    elif command -v md5 >/dev/null; then md5 -q
    else return 1
    fi
}

# downloads $1.gz from mirror $2 into DIR and checks it; on failure nothing is left behind
fetch_one() {
    local f=$1 url=$2$1.gz part="$dir/$1.gz.part" sum
    if ! curl -fsSL --connect-timeout 15 --retry 1 -o "$part" "$url"; then
        rm -f "$part"
        echo "  $url: download failed" >&2
        return 1
    fi
    sum=$(gzip -dc <"$part" | md5_of_stream)
    if [ "$sum" != "$(expected_md5 "$f")" ]; then
        rm -f "$part"
        echo "  $url: md5 of the decompressed file is '$sum', expected $(expected_md5 "$f")" >&2
        return 1
    fi
    mv "$part" "$dir/$f.gz"
}

command -v curl >/dev/null || give_up "curl is not installed, so nothing can be downloaded"
command -v gzip >/dev/null || give_up "gzip is not installed, so downloads cannot be checked"
echo "" | md5_of_stream >/dev/null || give_up "neither md5sum nor md5 is installed, so downloads cannot be checked"
mkdir -p "$dir" || give_up "cannot create $dir"

for mirror in $MIRRORS; do
    case $mirror in */) ;; *) mirror=$mirror/ ;; esac
    echo "downloading MNIST from $mirror into $dir"
    for f in $(missing); do
        fetch_one "$f" "$mirror" || break
        echo "  $f.gz: ok"
    done
    [ -z "$(missing)" ] && { echo "MNIST ready in $dir"; exit 0; }
done
give_up "could not download$(for f in $(missing); do printf ' %s' "$f.gz"; done) from any mirror ($MIRRORS)"
