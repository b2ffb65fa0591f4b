#!/usr/bin/env bash
# Build Perfetto's trace_processor_shell from source with Debian's toolchain and libraries (and
# SQLite's amalgamation from npm), none of Perfetto's own downloads: the binary that
# tests/timing/test_trace_viewers.py reads flopscope's traces with, through the perfetto package.
#
#   bash scripts/build_trace_processor.sh PERFETTO_SOURCE [BUILD_DIR]
#   FLOPSCOPE_TRACE_PROCESSOR=BUILD_DIR/out/trace_processor_shell pytest tests/timing/test_trace_viewers.py
#
# PERFETTO_SOURCE: a git directory (bare or not) of google/perfetto holding the tag below, or a
# source tree already unpacked. BUILD_DIR (default /tmp/perfetto-build) gets the unpacked tree
# (src/), the build (out/) and the log (build.log). Run as root on Debian 12 (apt-get installs
# the build tools). Perfetto's own tools/install-build-deps downloads clang, libc++, protobuf,
# sqlite, re2, zstd... from hosts outside Debian, PyPI and npm; instead, GN's arguments below
# point at the system's protobuf and zlib, build with GCC and libstdc++, and leave out the
# optional pieces that would need more sources (REPL line editing, LLVM demangling, re2, zstd,
# Instruments and ETM importers, the percentile extension). SQLite: Debian 12's 3.40 is older
# than the 3.41.2 Perfetto requires (src/trace_processor/sqlite/sql_source.cc stops the build),
# so the build compiles the SQLite amalgamation that the npm package better-sqlite3 12.11.1
# ships: SQLite 3.53.2, the version Perfetto v58.2 is written against. About 1,800 build steps,
# some 430 of them heavy C++ files (about 6 s of CPU each with GCC 12): roughly an hour of CPU,
# so half an hour or more on two idle cores and hours on a loaded machine. Re-running the script
# resumes the build where it stopped.
set -euo pipefail
tag=v58.2
source=${1:?usage: build_trace_processor.sh PERFETTO_SOURCE [BUILD_DIR]}
build=${2:-/tmp/perfetto-build}
mkdir -p "$build"

if ! command -v gn >/dev/null || ! command -v ninja >/dev/null || ! command -v protoc >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq generate-ninja ninja-build g++ \
        zlib1g-dev libprotobuf-dev libprotoc-dev protobuf-compiler
fi
command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm

if [ ! -f "$build/src/BUILD.gn" ]; then
    if [ -f "$source/BUILD.gn" ]; then
        cp -a "$source" "$build/src"
    else
        # Only the paths the build reads: a partial clone may lack the blobs of docs/ or test data.
        gitdir=$(git -C "$source" rev-parse --absolute-git-dir)
        mkdir -p "$build/src"
        paths=(.gn BUILD.gn build_overrides buildtools gn include protos src tools python
               third_party sdk CHANGELOG)
        while read -r p; do paths+=("$p"); done < <(git --git-dir="$gitdir" ls-tree --name-only \
            "$tag" test/ | grep -v '^test/data$')
        for p in "${paths[@]}"; do  # (a partial clone's git archive names each missing blob)
            git --git-dir="$gitdir" archive "$tag" -- "$p" 2>/dev/null | tar -x -C "$build/src"
        done
    fi
fi

sqlite=$build/src/buildtools/sqlite
if ! grep -qs 'define SQLITE_VERSION_NUMBER 3053002' "$sqlite/sqlite3.h"; then
    npm_dir=$(mktemp -d)
    (cd "$npm_dir" && npm pack -q better-sqlite3@12.11.1 >/dev/null \
        && tar -xzf better-sqlite3-12.11.1.tgz package/deps/sqlite3)
    mkdir -p "$sqlite"
    cp "$npm_dir"/package/deps/sqlite3/{sqlite3.c,sqlite3.h,sqlite3ext.h} "$sqlite"/
    rm -rf "$npm_dir"
    grep -q 'define SQLITE_VERSION_NUMBER 3053002' "$sqlite/sqlite3.h"
fi
# GN lists the percentile extension's source with the hermetic SQLite even when it is off
mkdir -p "$build/src/buildtools/sqlite_src/ext/misc"
printf '/* The percentile extension is off (enable_perfetto_trace_processor_percentile). */\n%s\n' \
    'typedef int perfetto_no_percentile;' > "$build/src/buildtools/sqlite_src/ext/misc/percentile.c"

mkdir -p "$build/out"
cat > "$build/out/args.gn" <<'EOF'
is_debug = false
is_clang = false
use_custom_libcxx = false
skip_buildtools_check = true
perfetto_use_system_protobuf = true
perfetto_use_system_sqlite = false
perfetto_use_system_zlib = true
enable_perfetto_zstd = false
enable_perfetto_re2 = false
enable_perfetto_trace_processor_linenoise = false
enable_perfetto_trace_processor_percentile = false
enable_perfetto_trace_processor_mac_instruments = false
enable_perfetto_llvm_demangle = false
enable_perfetto_etm_importer = false
enable_perfetto_unittests = false
enable_perfetto_integration_tests = false
enable_perfetto_benchmarks = false
enable_perfetto_fuzzers = false
enable_perfetto_ui = false
enable_perfetto_heapprofd = false
enable_perfetto_traced_perf = false
perfetto_enable_git_rev_version_header = false
enable_perfetto_version_gen = false
extra_cflags = "-O1 -g0"
EOF
(cd "$build/src" && gn gen ../out)
nice -n 19 ninja -C "$build/out" -j"${JOBS:-2}" trace_processor_shell 2>&1 | tee "$build/build.log" \
    | grep -E '^(FAILED|ninja: )|error:' || true
test -x "$build/out/trace_processor_shell"
"$build/out/trace_processor_shell" --version
echo "export FLOPSCOPE_TRACE_PROCESSOR=$build/out/trace_processor_shell"
