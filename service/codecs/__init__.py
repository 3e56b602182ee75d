"""The wire formats: request bodies and messages to numpy, and results back, one module each.

    TF Serving REST's JSON (`:predict`, any signature)      tfserving_json
    TensorProto (TF Serving's gRPC Predict)                 tensor_proto
    SignatureDefMap, the image contract's signature         signatures
    tf.Example (`:classify`, `:regress`, gRPC's Input)      tf_example
    Open Inference Protocol, HTTP (JSON and binary)         v2_rest
    Open Inference Protocol, gRPC                           v2_grpc
      their shared tensor rules; a model's V2 metadata      v2_tensors; v2_metadata
    the friendly /predict's JSON                            simple_json
    JSON arrays of images; image files                      pixels; images
    Content-Encoding (gzip, deflate)                        compression
    JSON text (orjson; simdjson for the usual bodies)       json_body
    shared by all: dtypes' names; values and their words    dtypes; values

The image contract's input (`image` float32 [-1, 28, 28]) has no API of its own: each reader
takes any signature, and reads that one by the fast path built for it, with the same answers.
Readers return the data plane's `Inputs` (each input by name; the image contract's one array).
Every error says where in the request it is, what was expected and what came, after TF
Serving's own words where it has them. Nothing here imports TensorFlow, the protocols or the
data plane.
"""
