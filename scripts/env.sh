# Source this to build and run offgnn by hand: it points tch's build at the
# project's virtualenv (libtorch from the torch wheel) and the binaries at
# torch's shared libraries. scripts/setup creates the virtualenv.
_offgnn_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VIRTUAL_ENV="$_offgnn_root/.venv"
case ":$PATH:" in
  *":$VIRTUAL_ENV/bin:"*) ;;
  *) export PATH="$VIRTUAL_ENV/bin:$PATH" ;;
esac
export LIBTORCH_USE_PYTORCH=1
_offgnn_torch_lib="$(ls -d "$VIRTUAL_ENV"/lib/python3*/site-packages/torch/lib 2>/dev/null | head -n1)"
if [ -n "$_offgnn_torch_lib" ]; then
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$_offgnn_torch_lib:"*) ;;
    *) export LD_LIBRARY_PATH="$_offgnn_torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
  esac
fi
unset _offgnn_torch_lib
