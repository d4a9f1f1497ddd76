#!/bin/sh
# ctest install_consumers: installs the build into a fresh prefix and uses it
# from outside the tree, as a user would: (a) a CMake project with
# find_package(nabla) and nabla::nabla builds a graph, differentiates it and
# checks the gradient; (b) a C program built with
# `cc c_api.c $(pkg-config --cflags --libs nabla)` does the same through the
# C API; (c) where Ruby has ruby-ffi, examples/ruby/nabla.rb loads the
# installed libnabla.so.0 by name. Also checks that the installed headers
# include only each other and the standard library (nothing under src/, no
# nlohmann_json), and that the installed package files do not point into the
# source or build tree, and that the installed command line tool runs from
# there.
# Usage: check.sh CMAKE BUILD_DIR WORK_DIR LIBDIR GENERATOR MAKE_PROGRAM CC CXX
set -eu
cmake=$1 build=$2 work=$3 libdir=$4 generator=$5 make_program=$6 cc=$7 cxx=$8
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
prefix=$work/prefix
rm -rf "$work" && mkdir -p "$work"

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"

# Every #include "..." in an installed header names an installed header; every
# #include <...> is the standard library's.
status=0
for h in $(find "$prefix/include" -name '*.h' -o -name '*.hpp'); do
  for inc in $(sed -n 's/^#include "\(.*\)".*/\1/p' "$h"); do
    [ -f "$prefix/include/$inc" ] || { echo "$h includes \"$inc\", which is not installed"; status=1; }
  done
  for inc in $(sed -n 's/^#include <\(.*\)>.*/\1/p' "$h"); do
    case $inc in
      */*) echo "$h includes <$inc>, not a standard header"; status=1 ;;
    esac
  done
done
if grep -rn -e "$src" -e "$build" "$prefix/$libdir/cmake/nabla" "$prefix/$libdir/pkgconfig"; then
  echo "the installed package files above point into the source or build tree"
  status=1
fi
[ $status -eq 0 ] || exit 1
# The command line tool, installed and run from outside the tree.
(cd "$work" && "$prefix/bin/nabla" ops >"$work/ops.txt") || { echo "the installed $prefix/bin/nabla ops failed"; exit 1; }
grep -q "attention" "$work/ops.txt" || { echo "the installed nabla ops lists no attention op"; exit 1; }

# (a) CMake: find_package(nabla) + nabla::nabla, same generator and compiler.
"$cmake" -S "$here/app" -B "$work/app" -G "$generator" -DCMAKE_MAKE_PROGRAM="$make_program" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >"$work/app.log"
"$cmake" --build "$work/app" >>"$work/app.log" || { cat "$work/app.log"; exit 1; }
"$work/app/app"

# (b) C: the documented pkg-config command, nothing else on the command line.
PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs nabla)
echo "pkg-config --cflags --libs nabla: $flags"
# shellcheck disable=SC2086  # the flags are words
"$cc" "$here/c_api.c" $flags -o "$work/c_api"
# A shared nabla (BUILD_SHARED_LIBS=ON) is found at run time as any library
# outside the loader's paths is; a static one needs nothing.
LD_LIBRARY_PATH=$prefix/$libdir "$work/c_api"

# (c) The Ruby binding loads the installed libnabla.so.0 by name (where Ruby
# and ruby-ffi are installed: scripts/install-deps installs them).
if command -v ruby >/dev/null 2>&1 && ruby -e 'require "ffi"' 2>/dev/null; then
  LD_LIBRARY_PATH=$prefix/$libdir ruby -e '
    require ARGV[0]
    Nabla.load
    ctx = Nabla::Context.new
    puts "ruby: loaded #{Nabla.ffi_libraries.map(&:name).join(", ")}"' "$src/examples/ruby/nabla.rb"
fi
