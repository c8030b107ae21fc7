"""Where Gemma 4 is served, above serving/ and sagemaker/: the Endpoint, its shared budget, the parts' SageMaker endpoints."""
