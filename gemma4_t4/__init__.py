"""gemma4_t4: run Google's Gemma 4 on NVIDIA T4 GPUs with vLLM.

One module per capability; the notebooks, the ``gemma4-t4`` CLI and the MCP server all call
the same functions.
"""

__version__ = "0.1.0"
