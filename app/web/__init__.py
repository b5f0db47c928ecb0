"""The ledger's web page at ``/``: one HTML document with its script and style, shipped in
the package (no build step, nothing loaded from elsewhere). It shows what the REST API
answers, polled by the browser, so it needs no state or permission of its own."""
