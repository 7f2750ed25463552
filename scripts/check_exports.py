#!/usr/bin/env python3
"""What libfusejit.so exports: the installed API (namespace fusejit) and its classes' type
information and virtual tables, nothing else.

    scripts/check_exports.py LIB             exit 0: only those; 1: prints every other symbol
    scripts/check_exports.py --self-test LIB proves the check fails on a planted std:: symbol and
                                             on an empty table (CI runs it)

Why it matters (cmake/libfusejit.map): an exported instantiation of a standard library template
can be interposed by another library of the process with the same name, and PyTorch's
instantiations of std::regex, built from other libstdc++ headers, crashed fusejit's first
NVRTC compile in a process that had imported torch.
"""
import subprocess
import sys

ALLOWED_PREFIXES = ("fusejit::", "typeinfo for fusejit::", "typeinfo name for fusejit::",
                    "vtable for fusejit::")


def exported(lib):
    """The demangled names of the library's defined dynamic symbols."""
    out = subprocess.run(["nm", "-D", "--defined-only", "--demangle", lib], check=True,
                         capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(" ", 2)  # address, type, name
        if len(parts) == 3:
            names.append(parts[2])
    return names


def offenders(names):
    return [n for n in names if not n.startswith(ALLOWED_PREFIXES)]


def check(names):
    if not any(n.startswith("fusejit::") for n in names):
        return ["no fusejit:: symbol at all: not the library, or its API is not exported"]
    return offenders(names)


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        planted = ("std::__detail::_Compiler<std::__cxx11::regex_traits<char> >::"
                   "_M_alternative()")
        failures = []
        if planted not in check(exported(argv[2]) + [planted]):
            failures.append("a planted std:: symbol was not reported")
        if not check([]):
            failures.append("an empty symbol table passed")
        for f in failures:
            print(f"self-test: {f}")
        return 1 if failures else 0
    if len(argv) != 2:
        print(__doc__)
        return 2
    bad = check(exported(argv[1]))
    for name in bad:
        print(f"{argv[1]}: exports {name}")
    if bad:
        print(f"{len(bad)} symbol(s) outside the installed API (see cmake/libfusejit.map)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
