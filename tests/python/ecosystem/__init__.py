"""Training programs from outside the test matrix (the ecosystem probe, tests/python/test_ecosystem.py): each is a
(build, step) pair as harness.py describes, named in PROGRAMS."""
from . import extensions, frontends, hugging_face, layers_and_side_effects, optimizers, third_party, training_loops

PROGRAMS = {}
for _module in (training_loops, layers_and_side_effects, extensions, optimizers, hugging_face, frontends, third_party):
    for _name, _program in _module.PROGRAMS.items():
        assert _name not in PROGRAMS, f"two ecosystem programs are named {_name}"
        PROGRAMS[_name] = _program
