"""Framework adapters and the HTTP client: where users of LangChain, LlamaIndex and
Haystack meet RAGSpine.

* ``client.RagspineClient`` — the service's HTTP API, typed errors (stdlib only);
* ``langchain.RagspineRetriever`` (``[langchain]``), ``llamaindex.RagspineRetriever``
  (``[llamaindex]``), ``haystack.RagspineRetriever`` (``[haystack]``) — each over a
  warehouse in this process (the one serving assembly) or a ``ragspine serve`` over HTTP.

This room sits outside the engine: nothing in ``ragspine_pipeline`` imports it, and it
uses only the public doors (``serving``, ``filter_input``, ``sensitivity``), never the
retrieval layers, the warehouse internals or the service (.importlinter). Importing this
package imports no framework; each adapter module imports its own.
"""

from .client import RagspineClient, RagspineError

__all__ = ["RagspineClient", "RagspineError"]
