"""Protocol adapters: thin layers that parse a protocol's requests, call the data plane and
render its typed results in that protocol's form."""
