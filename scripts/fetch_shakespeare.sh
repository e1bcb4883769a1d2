#!/usr/bin/env bash
# fetch_shakespeare.sh DIR
#
# Makes sure DIR holds input.txt of Tiny Shakespeare (1,115,394 bytes, md5
# 6fb458f1232090904fb40fe944165e91). When it is there and whole it does nothing. Otherwise it
# downloads it with curl (SHAKESPEARE_URL overrides the address) and checks the md5 before
# putting it in place. Exits 0 when DIR is ready, non-zero with instructions otherwise.
set -u

URL=${SHAKESPEARE_URL:-https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt}
MD5=6fb458f1232090904fb40fe944165e91

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
dir=${1%/}

md5_of() {
    if command -v md5sum >/dev/null; then md5sum <"$1" | cut -d' ' -f1
    elif command -v md5 >/dev/null; then md5 -q "$1"
    else echo "no md5sum or md5 to check $1 with" >&2; return 1
    fi
}

give_up() {
    cat >&2 <<MSG
fetch_shakespeare.sh: $1
Tiny Shakespeare is not in $dir. Either
  - put input.txt there (for example from $URL), or
  - use a folder that already has it:  make shakespeare SHAKESPEARE_DIR=/path/to/tinyshakespeare
MSG
    exit 1
}

if [ -f "$dir/input.txt" ]; then
    sum=$(md5_of "$dir/input.txt") || exit 1
    if [ "$sum" = "$MD5" ]; then
        echo "found Tiny Shakespeare in $dir"
        exit 0
    fi
    give_up "$dir/input.txt has md5 $sum, not $MD5 (a different or damaged file; remove it to download it again)"
fi
command -v curl >/dev/null || give_up "curl is not installed"
mkdir -p "$dir" || give_up "cannot create $dir"
part="$dir/input.txt.part"
echo "downloading $URL"
if ! curl -fsSL --connect-timeout 15 --retry 1 -o "$part" "$URL"; then
    rm -f "$part"
    give_up "the download failed"
fi
sum=$(md5_of "$part") || { rm -f "$part"; exit 1; }
if [ "$sum" != "$MD5" ]; then
    rm -f "$part"
    give_up "the downloaded file has md5 $sum, not $MD5"
fi
mv "$part" "$dir/input.txt" && echo "Tiny Shakespeare is in $dir"
