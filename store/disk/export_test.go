package disk

import "os"

// SetHooksForTest injects faults: write runs before each write to a
// fill's file (a non-nil error fails it, as a full disk would); create
// runs before a fill's file is created. Set them before the first Get.
func SetHooksForTest(c *Cache, write func(p []byte) error, create func() error) {
	c.hooks = hooks{write: write, create: create}
}

// PathForTest is where the complete file of a 64-hex key lives.
func PathForTest(c *Cache, key string) string { return c.path(key) }

// SetVariantHookForTest runs hook on each encoded variant's temporary
// file before it is verified (a non-nil error fails the build).
func SetVariantHookForTest(c *Cache, hook func(f *os.File) error) { c.hooks.variant = hook }

// SetGrowHookForTest makes every write of a growing variant write
// hook(p) instead of p (a corrupting hook returns an altered copy).
func SetGrowHookForTest(c *Cache, hook func(p []byte) []byte) { c.hooks.grow = hook }

// SetRemoveHookForTest runs hook before each dropped or stale file is
// unlinked (a blocking hook holds the unlink back).
func SetRemoveHookForTest(c *Cache, hook func(p string)) { c.hooks.remove = hook }
