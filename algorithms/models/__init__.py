"""Models built here rather than downloaded: the tiny Qwen2-architecture policy of the quickstart
and the tests (`tiny.build_tiny_model`)."""
