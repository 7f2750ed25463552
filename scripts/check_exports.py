#!/usr/bin/env python3
"""What libfusejit.so exports: the installed API (namespace fusejit) and what its classes need
across the boundary (type information, virtual tables, thunks, VTTs, guard variables), nothing
else, and the API's entry points all there.

    scripts/check_exports.py LIB             exit 0: so; 1: prints every symbol out of place and
                                             every entry point missing
    scripts/check_exports.py --self-test LIB proves the check fails on planted std:: symbols (one
                                             whose demangled name starts with a fusejit type), on
                                             a missing entry point and on an empty table (CI
                                             runs it)

Why it matters (cmake/libfusejit.map): an exported instantiation of a standard library template
can be interposed by another library of the process with the same name, and PyTorch's
instantiations of std::regex, built from other libstdc++ headers, crashed fusejit's first
NVRTC compile in a process that had imported torch.

Names are judged mangled, as the version script matches them: a demangled std instantiation
starts with its return type ("fusejit::Shape& std::vector<fusejit::Shape>::emplace_back(...)").
"""
import re
import subprocess
import sys

# Nested names in namespace fusejit (with const/ref qualifiers), their local statics, and the
# special names of its classes: the set cmake/libfusejit.map means to export, written out here
# rather than read from the map, so that a map whose globs reach too far fails the check (the
# map's thunk globs would also take a std class's thunk that names a fusejit type; these
# patterns would not).
ALLOWED = re.compile(r"^_Z(Z?N[KRO]*7fusejit|T[ISVT]N7fusejit|Th[^N]*N7fusejit|"
                     r"Tv[^N]*N7fusejit|GVZ?N7fusejit)")
# Entry points every consumer of the installed API needs (demangled prefixes): the check fails
# if a change to the version script drops them.
REQUIRED = ("fusejit::Plan::Plan(", "fusejit::Plan::run(", "fusejit::BackwardPlan::BackwardPlan(",
            "fusejit::BackwardPlan::run(", "fusejit::Problem::validate(",
            "typeinfo for fusejit::Error", "typeinfo for fusejit::InvalidArgument",
            "vtable for fusejit::Error")


def exported(lib):
    """(mangled, demangled) names of the library's defined dynamic symbols."""
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True,
                         text=True).stdout
    mangled = [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), check=True,
                               capture_output=True, text=True).stdout.splitlines()
    assert len(demangled) == len(mangled), "c++filt gave a name per line"
    return list(zip(mangled, demangled))


def problems(table):
    bad = [f"exports {demangled} ({mangled})" for mangled, demangled in table
           if not ALLOWED.match(mangled)]
    have = [demangled for _, demangled in table]
    bad += [f"does not export {want}..." for want in REQUIRED
            if not any(d.startswith(want) for d in have)]
    return bad


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        table = exported(argv[2])
        planted = [
            ("_ZNSt6vectorIN7fusejit5ShapeESaIS1_EE12emplace_backIJS1_EEERS1_DpOT_",
             "fusejit::Shape& std::vector<fusejit::Shape>::emplace_back<fusejit::Shape>"
             "(fusejit::Shape&&)"),
            ("_ZNSt8__detail9_CompilerINSt7__cxx1112regex_traitsIcEEE14_M_alternativeEv",
             "std::__detail::_Compiler<std::__cxx11::regex_traits<char> >::_M_alternative()"),
        ]
        failures = []
        for p in planted:
            if not any(p[0] in b for b in problems(table + [p])):
                failures.append(f"a planted {p[1]} was not reported")
        without_run = [t for t in table if not t[1].startswith("fusejit::Plan::run(")]
        if not any("fusejit::Plan::run(" in b for b in problems(without_run)):
            failures.append("a table without fusejit::Plan::run passed")
        if not problems([]):
            failures.append("an empty symbol table passed")
        for f in failures:
            print(f"self-test: {f}")
        return 1 if failures else 0
    if len(argv) != 2:
        print(__doc__)
        return 2
    bad = problems(exported(argv[1]))
    for b in bad:
        print(f"{argv[1]}: {b}")
    if bad:
        print(f"{len(bad)} problem(s) with the dynamic symbol table (see cmake/libfusejit.map)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
