"""How the job is spread over processes: the process group, tensor and expert parallelism (context and pipeline
parallelism to come), the gradient reduction."""
