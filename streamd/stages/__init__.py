"""The three pipeline stages, each by concept with its spec, CPU twin and CUDA implementation side by side:
``preprocess/`` (letterbox + normalise), ``postprocess/`` (decode layouts + NMS), and the stage contract
(``contract``) with its CPU (``cpu``) and three-CUDA-stream (``cuda``) implementations around an engine."""
