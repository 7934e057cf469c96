// Command rpcdescriptors writes the google.rpc protos the Python client
// needs (google/rpc/status.proto and google/rpc/error_details.proto, with
// the files they import) to stdout as a binary FileDescriptorSet, for
// `protoc --descriptor_set_in` in clients/python/generate.sh.
//
// The .proto sources are not on a fresh machine (Debian's protobuf-compiler
// ships only google/protobuf), but the generated Go packages of the module
// go.mod pins (google.golang.org/genproto/googleapis/rpc) embed their
// descriptors, so the Python code is generated from exactly the messages
// the server encodes its error details with.
package main

import (
	"fmt"
	"os"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rpcdescriptors:", err)
		os.Exit(1)
	}
}

func run() error {
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	// add appends a file after its imports, each once, so protoc sees every
	// dependency before the file that uses it.
	var add func(protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	add(status.File_google_rpc_status_proto)
	add(errdetails.File_google_rpc_error_details_proto)
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(set)
	if err != nil {
		return fmt.Errorf("proto.Marshal: %w", err)
	}
	_, err = os.Stdout.Write(out)
	return err
}
