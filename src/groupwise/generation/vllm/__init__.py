"""The vLLM backend (``generation.backend: vllm``): ``factory`` builds ``engine`` (over ``vllm.LLM``) or ``stream``
(over ``AsyncLLM``, with ``stream_rows`` and ``pauses``); ``rows`` maps requests and outputs, ``weights`` loads weights
into a live engine, ``setup`` sets vLLM up and imports it, only once the backend is chosen (these modules import
without vLLM)."""
