package disk

// SetHooksForTest injects faults: write runs before each write to a
// fill's file (a non-nil error fails it, as a full disk would); create
// runs before a fill's file is created. Set them before the first Get.
func SetHooksForTest(c *Cache, write func(p []byte) error, create func() error) {
	c.hooks = hooks{write: write, create: create}
}

// PathForTest is where the complete file of a 64-hex key lives.
func PathForTest(c *Cache, key string) string { return c.path(key) }
