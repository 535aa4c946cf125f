#!/usr/bin/env python3
"""Rewrites a CUDA launcher file (.cu) into C++ the CPU emulation compiles.

Every launch `NAME<<<CONFIG>>>(ARGS)` becomes
`::emu::launch(::emu::LaunchConfig(CONFIG), [&] { NAME(ARGS); })`: the kernel
call moves into a lambda that each emulated thread runs, so template
arguments are still deduced from ARGS as nvcc deduces them, and
`::emu::launch` (tests/cuda_emulation/shim/emu_host.h) checks the
configuration the way the GPU does before running any block. Nothing else in
the file changes, so the launchers' own logic (the kernel and grid they
choose, the scratch they carve, the attributes they set) is what runs.

Usage: rewrite_launches.py SOURCE.cu OUTPUT.cpp. Fails loudly on a launch
whose shape it cannot read, and on a file with no launch at all.
"""
import os
import sys

IDENT = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:")


def fail(path, pos, text, why):
    line = text.count("\n", 0, pos) + 1
    sys.exit(f"{path}:{line}: {why}; update tests/cuda_emulation/rewrite_launches.py")


def kernel_name_start(text, at, path):
    """The start of the kernel expression ending just before `at` (`<<<`)."""
    i = at - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    if i >= 0 and text[i] == ">":  # explicit template arguments
        depth = 0
        while i >= 0:
            c = text[i]
            if c == ">":
                depth += 1
            elif c == "<":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        if i < 0:
            fail(path, at, text, "unbalanced template arguments before <<<")
        i -= 1
    end = i
    while i >= 0 and text[i] in IDENT:
        i -= 1
    if i == end:
        fail(path, at, text, "no kernel name before <<<")
    return i + 1


def closing_paren(text, open_at, path):
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    fail(path, open_at, text, "unbalanced kernel arguments")


def rewrite(text, path):
    out, done, launches = [], 0, 0
    while True:
        at = text.find("<<<", done)
        if at < 0:
            break
        start = kernel_name_start(text, at, path)
        cfg_end = text.find(">>>", at)
        if cfg_end < 0:
            fail(path, at, text, "<<< without >>>")
        args_at = cfg_end + 3
        while text[args_at].isspace():
            args_at += 1
        if text[args_at] != "(":
            fail(path, at, text, "no argument list after >>>")
        args_end = closing_paren(text, args_at, path)
        name = text[start:at].strip()
        config = text[at + 3 : cfg_end]
        args = text[args_at : args_end + 1]
        out.append(text[done:start])
        out.append(f"::emu::launch(::emu::LaunchConfig({config}), [&] {{ {name}{args}; }})")
        done = args_end + 1
        launches += 1
    out.append(text[done:])
    if launches == 0:
        sys.exit(f"{path}: no kernel launch found; nothing to emulate")
    return "".join(out)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: rewrite_launches.py SOURCE.cu OUTPUT.cpp")
    source, output = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    result = f'// Generated from {source} by tests/cuda_emulation/rewrite_launches.py.\n#line 1 "{source}"\n'
    result += rewrite(text, source)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output + ".tmp", "w", encoding="utf-8") as f:
        f.write(result)
    os.replace(output + ".tmp", output)


if __name__ == "__main__":
    main()
