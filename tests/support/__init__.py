"""Plain modules that test files share (fixtures live in the conftest.py files): assertions
and images (helpers), free ports and the servers tests start (servers), the fast tier's fake
backends (fakes), TF Serving's stand-in, the training and manifest helpers."""
