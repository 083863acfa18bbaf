"""gpufed placement package."""

from placement import _compiled

# Whether the decision modules run compiled (mypyc), from a build of these very sources (`_compiled`).
COMPILED: bool = _compiled.load(__path__)
