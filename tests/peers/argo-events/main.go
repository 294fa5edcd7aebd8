// The argo-events command as upstream's cmd/main.go builds it, but for one thing: with
// METRICS_ADDRESS set, `eventsource-service` and `sensor-service` serve their metrics
// there, not on :7777 (v1alpha1.EventSourceMetricsPort and SensorMetricsPort, a
// constant: each pod has its own network, but the live tier's pods share the host's).
// They start as pkg/eventsources/cmd.Start and pkg/sensors/cmd.Start do, through the
// same exported constructors (but the NATS Streaming bus's atLeastOnce override, which a
// JetStream bus never needs); every other command is upstream's own.
package main

import (
	"encoding/base64"
	"encoding/json"
	"os"

	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"

	"github.com/argoproj/argo-events/cmd/commands"
	"github.com/argoproj/argo-events/pkg/apis/events/v1alpha1"
	"github.com/argoproj/argo-events/pkg/eventsources"
	"github.com/argoproj/argo-events/pkg/metrics"
	"github.com/argoproj/argo-events/pkg/sensors"
	"github.com/argoproj/argo-events/pkg/shared/logging"
	sharedutil "github.com/argoproj/argo-events/pkg/shared/util"
)

func main() {
	address := os.Getenv("METRICS_ADDRESS")
	if address == "" || len(os.Args) != 2 {
		commands.Execute()
		return
	}
	switch os.Args[1] {
	case "eventsource-service":
		eventSource(address)
	case "sensor-service":
		sensor(address)
	default:
		commands.Execute()
	}
}

// decode reads the base64 JSON of the environment variable name into into, as the
// controller passes the objects; unset is an error only when required.
func decode(logger *zap.SugaredLogger, name string, required bool, into any) {
	encoded, defined := os.LookupEnv(name)
	if !defined && required {
		logger.Fatalf("required environment variable '%s' not defined", name)
	}
	if encoded == "" {
		return
	}
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err == nil {
		err = json.Unmarshal(raw, into)
	}
	if err != nil {
		logger.Fatalw("failed to decode "+name, zap.Error(err))
	}
}

func required(logger *zap.SugaredLogger, name string) string {
	value, defined := os.LookupEnv(name)
	if !defined {
		logger.Fatalf("required environment variable '%s' not defined", name)
	}
	return value
}

func eventSource(address string) {
	logger := logging.NewArgoEventsLogger().Named("eventsource")
	eventSource, busConfig := &v1alpha1.EventSource{}, &v1alpha1.BusConfig{}
	decode(logger, v1alpha1.EnvVarEventSourceObject, true, eventSource)
	decode(logger, v1alpha1.EnvVarEventBusConfig, false, busConfig)
	subject := required(logger, v1alpha1.EnvVarEventBusSubject)
	hostname := required(logger, v1alpha1.EnvVarPodName)
	logger = logger.With(logging.LabelEventSourceName, eventSource.Name)
	ctx := logging.WithLogger(signals.SetupSignalHandler(), logger)
	m := metrics.NewMetrics(eventSource.Namespace)
	go m.Run(ctx, address)
	adaptor := eventsources.NewEventSourceAdaptor(eventSource, busConfig, subject, hostname, m)
	if err := adaptor.Start(ctx); err != nil {
		logger.Fatalw("failed to start eventsource server", zap.Error(err))
	}
}

func sensor(address string) {
	logger := logging.NewArgoEventsLogger().Named("sensor")
	restConfig, err := sharedutil.GetClientConfig(os.Getenv(v1alpha1.EnvVarKubeConfig))
	if err != nil {
		logger.Fatalw("failed to get kubeconfig", zap.Error(err))
	}
	sensor, busConfig := &v1alpha1.Sensor{}, &v1alpha1.BusConfig{}
	decode(logger, v1alpha1.EnvVarSensorObject, true, sensor)
	decode(logger, v1alpha1.EnvVarEventBusConfig, false, busConfig)
	subject := required(logger, v1alpha1.EnvVarEventBusSubject)
	hostname := required(logger, v1alpha1.EnvVarPodName)
	logger = logger.With("sensorName", sensor.Name)
	ctx := logging.WithLogger(signals.SetupSignalHandler(), logger)
	m := metrics.NewMetrics(sensor.Namespace)
	go m.Run(ctx, address)
	context := sensors.NewSensorContext(
		kubernetes.NewForConfigOrDie(restConfig), dynamic.NewForConfigOrDie(restConfig),
		sensor, busConfig, subject, hostname, m,
	)
	if err := context.Start(ctx); err != nil {
		logger.Fatalw("failed to listen to events", zap.Error(err))
	}
}
