"""``gae identify``: which computation produced a column of stored advantages — every profile,
masked GAE and the critic-free estimators fitted to it and ranked (docs/identify.md).

The package's names load on first use, so that the command line's help (which reads the
defaults in :mod:`.defaults`) loads neither numpy nor pyarrow."""

from gaecli.lazy import lazy_exports

__getattr__, _LAZY = lazy_exports(
    __name__,
    {
        "gaecli.identify.options": ("IdentifyOptions",),
        "gaecli.identify.report": ("IdentifyReport",),
        "gaecli.identify.run": ("identify_files", "identify_table"),
    },
)

__all__ = list(_LAZY)
