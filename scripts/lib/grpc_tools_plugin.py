"""protoc plugin adapter for the generators built into grpc_tools.protoc.

Usage (normally via scripts/protoc-gen-grpc-tools, from buf.gen.yaml):

    grpc_tools_plugin.py GENERATOR   # python | pyi | grpc_python | go | go-grpc

Reads a CodeGeneratorRequest on stdin, runs grpc_tools.protoc with
--descriptor_set_in=<the request's files> --GENERATOR_out=<tmp dir>, and writes
the produced files back as a CodeGeneratorResponse on stdout. `go` and
`go-grpc` are protoc-gen-go and protoc-gen-go-grpc from PATH, run by the same
protoc: their files then name the same protoc version and embed the same
descriptors as scripts/generate-stubs' Go stubs.

Why not buf's `protoc_builtin` + `protoc_path`:
  * grpc_python is compiled into grpc_tools' protoc, not a stock protoc
    generator, so buf cannot proxy it (it looks for protoc-gen-grpc_python);
  * buf images set json_name on every field, and protoc then embeds those in
    the serialized descriptor of jobs_pb2.py, so the file would differ in its
    bytes from a plain `protoc -I protos ...` run (scripts/generate-stubs),
    although it behaves the same. This adapter clears json_name wherever it
    equals the default protoc derives itself, as protoc does when compiling
    from source, so both paths produce byte-identical files.
"""

import os
import sys
import tempfile

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc

GENERATORS = ("python", "pyi", "grpc_python", "go", "go-grpc")


def default_json_name(name: str) -> str:
    """protoc's ToJsonName: drop '_' and upper-case the letter after it."""
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        elif upper:
            out.append(ch.upper())
            upper = False
        else:
            out.append(ch)
    return "".join(out)


def _strip_fields(fields) -> None:
    for field in fields:
        if field.HasField("json_name") and field.json_name == default_json_name(field.name):
            field.ClearField("json_name")


def _strip_message(message: descriptor_pb2.DescriptorProto) -> None:
    _strip_fields(message.field)
    _strip_fields(message.extension)
    for nested in message.nested_type:
        _strip_message(nested)


def normalise(file: descriptor_pb2.FileDescriptorProto) -> None:
    _strip_fields(file.extension)
    for message in file.message_type:
        _strip_message(message)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in GENERATORS:
        print(f"usage: {argv[0]} {{{'|'.join(GENERATORS)}}}", file=sys.stderr)
        return 2
    generator = argv[1]

    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse()
    response.supported_features = plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL

    files = descriptor_pb2.FileDescriptorSet()
    files.file.extend(request.proto_file)
    for file in files.file:
        normalise(file)

    with tempfile.TemporaryDirectory() as tmp:
        descriptor_set = os.path.join(tmp, "request.binpb")
        with open(descriptor_set, "wb") as f:
            f.write(files.SerializeToString())
        out = os.path.join(tmp, "out")
        os.mkdir(out)
        target = f"{request.parameter}:{out}" if request.parameter else out
        rc = protoc.main(
            [
                "protoc",
                f"--descriptor_set_in={descriptor_set}",
                f"--{generator}_out={target}",
                *request.file_to_generate,
            ]
        )
        if rc != 0:
            response.error = f"grpc_tools.protoc --{generator}_out exited with {rc}"
        else:
            for dirpath, dirnames, filenames in os.walk(out):
                dirnames.sort()
                for name in sorted(filenames):
                    path = os.path.join(dirpath, name)
                    generated = response.file.add()
                    generated.name = os.path.relpath(path, out).replace(os.sep, "/")
                    with open(path, encoding="utf-8") as f:
                        generated.content = f.read()

    sys.stdout.buffer.write(response.SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
