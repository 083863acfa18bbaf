"""Copying and pickling the model's frozen values, compiled or not.

The model's modules are compiled with the placer (`placement/_compiled.py`). mypyc's native classes
pickle their attributes and set them back one by one on unpickling, which a frozen dataclass refuses
(`FrozenInstanceError`); `copy.deepcopy` takes the same road. The federation copies and pickles these
values (the API workers receive the scheduling settings as a pickle; the replay's workers receive
configs), so every frozen class of the model is registered here to be rebuilt by its constructor
from its init fields instead. The fields computed in `__post_init__` (`GangRequest.decision_key`,
say) are computed again, as for any new value. The same in both forms, so a value pickled by a
compiled process loads in an interpreted one and back.

This module stays interpreted (it is not in `_compiled.COMPILED`): pickle names `_rebuild` by module
and name, which a plain function always answers.
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable
from dataclasses import fields
from typing import Any


def _rebuild(cls: type[Any], args: tuple[object, ...]) -> object:
    return cls(*args)


def _reduce(value: Any) -> tuple[Callable[..., object], tuple[type[Any], tuple[object, ...]]]:
    cls: type[Any] = type(value)
    return _rebuild, (cls, tuple(getattr(value, f.name) for f in fields(cls) if f.init))


def keep_as_values(*classes: type[Any]) -> None:
    """Copy, deep-copy and pickle these dataclasses by their constructor (see the module's text)."""
    for cls in classes:
        if any(f.init and f.kw_only for f in fields(cls)):
            # Rebuilt positionally: a keyword-only field would need the keyword form.
            raise TypeError(f"{cls.__name__} has keyword-only fields; keep_as_values rebuilds positionally")
        copyreg.pickle(cls, _reduce)
