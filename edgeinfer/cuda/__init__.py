"""CUDA offload (the `cuda` extra, numba-cuda): the last layers of a model, and its output
head, on an NVIDIA GPU, as llama.cpp's -ngl. `placement` decides how many layers go there
(and says why none do); `offload.DeviceLayers` runs them; `kernels/` holds the device code.
Importing this package imports nothing heavy: numba.cuda loads only when a device is used."""
