"""Every binary of ours uses the shared C++ runtime that libtorch uses (Note [One C++ runtime] in
third_party/Dependencies.cmake): none may define __cxa_throw or __gxx_personality_v0 itself, which is
what a static copy of libstdc++ linked into it looks like. Such a copy makes any exception thrown from it
into libtorch's code (an operator's TORCH_CHECK reaching Python) kill the process instead of raising.

    python3 check_cxx_runtime.py BINARY...
"""
import subprocess
import sys

OWN_RUNTIME = ("__cxa_throw", "__gxx_personality_v0", "__cxa_begin_catch")


def defined_symbols(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def main(paths):
    bad = []
    for path in paths:
        own = sorted(set(OWN_RUNTIME) & defined_symbols(path))
        print(f"{path}: {'defines ' + ', '.join(own) if own else 'uses the shared C++ runtime'}")
        if own:
            bad.append(path)
    if bad:
        print(f"FAILED: {len(bad)} binary(ies) carry a static copy of libstdc++: {', '.join(bad)}. Link the shared "
              "one (Note [One C++ runtime] in third_party/Dependencies.cmake: the CMake output's 'C++ runtime:' "
              "line names it; a compiler whose library path finds libstdc++.a first needs it)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
