"""Training programs from outside the test matrix (the ecosystem probe, tests/python/test_ecosystem.py): each is a
(build, step) pair as harness.py describes, named in PROGRAMS; SLOW names the ones `make test` leaves to `make
ecosystem`."""
from . import (extensions, frontends, hugging_face, kernel_settings, layer_catalogue, layers_and_side_effects,
               model_surgery, optimizers, patterns, random_state, side_channels, storage_and_generation, subclasses,
               third_party, torchvision_tasks, training_changes, training_loops)

PROGRAMS = {}
for _module in (training_loops, layers_and_side_effects, extensions, optimizers, hugging_face, frontends, third_party,
                torchvision_tasks, patterns, side_channels, kernel_settings,
                storage_and_generation, model_surgery, random_state, layer_catalogue, training_changes,
                subclasses):
    for _name, _program in _module.PROGRAMS.items():
        assert _name not in PROGRAMS, f"two ecosystem programs are named {_name}"
        PROGRAMS[_name] = _program

SLOW = set(torchvision_tasks.SLOW)
