"""Serving the library to PyTorch: ``gemmrl.mm`` / ``gemmrl.linear`` / the custom op ``gemmrl::mm`` (dispatch),
one launcher per family behind one interface (launchers), the compiled hot path (fastpath, csrc/), the layout
choice, ``patch(model)``, and ``gemmrl`` as a bench candidate."""
