"""The upstream HTTP/1.1 client: the connection pool (``http1.py``) and the transport seam (``transport.py``).

The walker sends an adapter's :class:`~proxy.providers.base.UpstreamRequest` through a transport and
reads the answer; nothing here decides anything (docs/adr/0011).
"""
