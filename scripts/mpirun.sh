#!/usr/bin/env bash
# Runs an MPI program of the examples on this machine:
#   scripts/mpirun.sh NP PROGRAM [ARGS...]    mpirun -np NP PROGRAM ARGS, with the flags below
#   scripts/mpirun.sh --flags NP              prints those flags (for an mpirun line of one's own)
# It adds what this machine needs, and says on stderr what it added and why:
#   --allow-run-as-root   when run by root, which Open MPI otherwise refuses;
#   --oversubscribe       when NP is more than the cores, which Open MPI otherwise refuses;
#   --bind-to none        with Open MPI, when NP is less than the cores: Open MPI binds each
#                         process to one core by default, which would leave the threads of a
#                         process that has more than one core (--threads) on one core;
#   --mca coll_libnbc_iallreduce_algorithm 1   with Open MPI: the ring algorithm for the
#                         non-blocking all-reduce of the gradient buckets; below 4 processes
#                         Open MPI's default is a binomial tree, which moved large buckets at
#                         half the speed of the ring on the project's test machine.
set -eu
print=0
if [ "${1:-}" = --flags ]; then print=1; shift; fi
np=${1:?usage: scripts/mpirun.sh NP PROGRAM [ARGS...]}
shift
if ! command -v mpirun >/dev/null; then
    echo "mpirun not found: install an MPI (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2
    exit 1
fi
flags=()
notes=()
if [ "$(id -u)" = 0 ]; then
    flags+=(--allow-run-as-root)
    notes+=("--allow-run-as-root (running as root)")
fi
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
if [ "$np" -gt "$cores" ]; then
    flags+=(--oversubscribe)
    notes+=("--oversubscribe ($np processes on $cores cores)")
fi
if mpirun --version 2>/dev/null | grep -q 'Open MPI'; then
    if [ "$np" -lt "$cores" ]; then
        flags+=(--bind-to none)
        notes+=("--bind-to none ($np processes on $cores cores: room for more than one thread each)")
    fi
    flags+=(--mca coll_libnbc_iallreduce_algorithm 1)
    notes+=("--mca coll_libnbc_iallreduce_algorithm 1 (ring all-reduce for the gradient buckets)")
fi
if [ $print = 1 ]; then
    echo "${flags[*]}"
    exit 0
fi
[ ${#notes[@]} -gt 0 ] && printf 'mpirun: adding %s\n' "${notes[@]}" >&2
exec mpirun "${flags[@]}" -np "$np" "$@"
