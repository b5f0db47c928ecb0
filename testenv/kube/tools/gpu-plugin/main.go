// Command gpu-plugin is the DRA kubelet plugin of the test nodes' fake GPUs (see
// ../../nodes.sh, NODELEDGER_KUBE_GPU_NODE). It publishes a node's devices gpu0..gpuN-1 with
// the attributes nodeledger reads (index, uuid: the Slurm side's /dev/nvidiaI and the uuids
// tests/gpu uses), and prepares a claim by writing a CDI spec that gives the container
// exactly its devices: NODELEDGER_GPU_<index>=<uuid> and the node /dev/nvidia<index>.
// Kubernetes' own test driver (test/e2e/dra/test-driver) publishes devices without
// attributes and names only the claim in its CDI edits, so it cannot stand in for this.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const nvidiaMajor = 195 // /dev/nvidiaI is c 195:I, as in the Slurm test cluster

// cdiSpec and cdiDevice are the parts of a CDI spec (tags.cncf.io/container-device-interface)
// this driver writes.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name  string   `json:"name"`
	Edits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string        `json:"env"`
	DeviceNodes []cdiDeviceNode `json:"deviceNodes"`
}

type cdiDeviceNode struct {
	Path        string `json:"path"`
	Type        string `json:"type"`
	Major       int64  `json:"major"`
	Minor       int64  `json:"minor"`
	Permissions string `json:"permissions"`
}

type gpu struct {
	index int64
	uuid  string
}

type plugin struct {
	driver string
	cdiDir string
	gpus   map[string]gpu // by device name
}

func (p *plugin) specPath(claim types.UID) string {
	return filepath.Join(p.cdiDir, fmt.Sprintf("%s-%s.json", p.driver, claim))
}

func (p *plugin) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	spec := cdiSpec{Version: "0.6.0", Kind: p.driver + "/gpu"}
	var devices []kubeletplugin.Device
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != p.driver {
			continue
		}
		g, ok := p.gpus[result.Device]
		if !ok {
			return nil, fmt.Errorf("claim %s/%s: no device %q on this node", claim.Namespace, claim.Name, result.Device)
		}
		name := fmt.Sprintf("%s-%s", claim.UID, result.Device)
		spec.Devices = append(spec.Devices, cdiDevice{Name: name, Edits: cdiEdits{
			Env: []string{fmt.Sprintf("NODELEDGER_GPU_%d=%s", g.index, g.uuid)},
			DeviceNodes: []cdiDeviceNode{{
				Path: fmt.Sprintf("/dev/nvidia%d", g.index), Type: "c",
				Major: nvidiaMajor, Minor: g.index, Permissions: "rw",
			}},
		}})
		devices = append(devices, kubeletplugin.Device{
			Requests: []string{result.Request}, PoolName: result.Pool, DeviceName: result.Device,
			CDIDeviceIDs: []string{spec.Kind + "=" + name},
		})
	}
	if len(spec.Devices) == 0 {
		return devices, nil
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	// Written whole, then renamed: the runtime never reads half a spec.
	path := p.specPath(claim.UID)
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return nil, err
	}
	return devices, os.Rename(path+".tmp", path)
}

func (p *plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := p.prepare(claim)
		klog.FromContext(ctx).Info("prepared", "claim", klog.KObj(claim), "devices", devices, "err", err)
		results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return results, nil
}

func (p *plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(p.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		klog.FromContext(ctx).Info("unprepared", "claim", claim.String(), "err", err)
		results[claim.UID] = err
	}
	return results, nil
}

func (p *plugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (p *plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func main() {
	driver := flag.String("driver", "gpu.nodeledger.test", "the DRA driver name")
	node := flag.String("node", "", "the node's name")
	count := flag.Int("gpus", 4, "devices to publish: gpu0..gpuN-1")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig for publishing ResourceSlices")
	kubeletDir := flag.String("kubelet-dir", "", "the kubelet's --root-dir")
	cdiDir := flag.String("cdi-dir", "", "the container runtime's CDI spec directory")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*driver, *node, *count, *kubeconfig, *kubeletDir, *cdiDir); err != nil {
		klog.ErrorS(err, "gpu-plugin")
		os.Exit(1)
	}
}

func run(driver, node string, count int, kubeconfig, kubeletDir, cdiDir string) error {
	if node == "" || kubeletDir == "" || cdiDir == "" {
		return errors.New("-node, -kubelet-dir and -cdi-dir are required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	p := &plugin{driver: driver, cdiDir: cdiDir, gpus: map[string]gpu{}}
	devices := make([]resourceapi.Device, 0, count)
	for i := range int64(count) {
		g := gpu{index: i, uuid: fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i)}
		name := fmt.Sprintf("gpu%d", i)
		p.gpus[name] = g
		devices = append(devices, resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"index": {IntValue: &g.index},
			"uuid":  {StringValue: &g.uuid},
		}})
	}
	pluginDir := filepath.Join(kubeletDir, "plugins", driver)
	registryDir := filepath.Join(kubeletDir, "plugins_registry")
	for _, dir := range []string{cdiDir, pluginDir, registryDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.DriverName(driver), kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(client), kubeletplugin.HealthService(false),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registryDir))
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish the devices: %w", err)
	}
	klog.InfoS("serving", "driver", driver, "node", node, "devices", count)
	<-ctx.Done()
	return nil
}
