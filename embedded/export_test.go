package embedded

// StoreLocking reports whether Start locks its store directory on this
// system, for the tests.
const StoreLocking = storeLocking

// SetRoutePortsHook sets the function StartCluster calls with the route
// ports it reserved, just before it starts the nodes; nil removes it.
func SetRoutePortsHook(f func(ports []int)) { testHookRoutePorts = f }
