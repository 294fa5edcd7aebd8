// nats-server: the EventBus's JetStream, at the version of the lock's jetstream
// component (the image nats:2.10.29 that the Argo Events controller runs for it).
module fabrique.test/peers/nats-server

go 1.26.0

tool github.com/nats-io/nats-server/v2

require (
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/minio/highwayhash v1.0.3 // indirect
	github.com/nats-io/jwt/v2 v2.7.4 // indirect
	github.com/nats-io/nats-server/v2 v2.10.29 // indirect
	github.com/nats-io/nkeys v0.4.11 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	go.uber.org/automaxprocs v1.6.0 // indirect
	golang.org/x/crypto v0.37.0 // indirect
	golang.org/x/sys v0.32.0 // indirect
	golang.org/x/time v0.10.0 // indirect
)
