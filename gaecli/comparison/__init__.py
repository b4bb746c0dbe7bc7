"""The comparison of new (masked-GAE) against old advantages that ``gae recompute`` and
``gae diff`` both use: the streaming figures, figures per group, the top samples and the
plots' token sample."""
