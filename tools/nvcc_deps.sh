#!/bin/sh
# nvcc that also writes the header dependencies meson 1.0's ninja rule reads (<object>.d;
# meson passes nvcc no -MD), so that editing a .cuh or .h rebuilds the .cu objects that
# include it. tools/gpu_check.sh makes it the CUDA compiler with a native file:
#   printf "[binaries]\ncuda = '%s'\n" "$PWD/tools/nvcc_deps.sh" >nvcc.ini
#   meson setup build_cuda -Dcuda=enabled --native-file nvcc.ini
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
nvcc="nvcc"
command -v ccache >/dev/null 2>&1 && nvcc="ccache nvcc"  # meson adds ccache only to compilers it finds itself
case " $* " in
*" -c "*) [ -n "$out" ] && exec $nvcc "$@" -MD -MF "$out.d" ;;
esac
exec $nvcc "$@"
