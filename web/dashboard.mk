# The dashboard's browser assets: uPlot from npm (pinned by web/package-lock.json), copied into
# metricsd/http/static/vendor/, which ships in the Python package. Include from the Makefile:
#     include web/dashboard.mk
#     setup: dashboard-assets
# The copied files are committed, so a machine without npm keeps the ones in the tree (a warning
# says so); with npm they are refreshed whenever the lock file is newer than them.
DASHBOARD_VENDOR := metricsd/http/static/vendor
DASHBOARD_ASSETS := $(DASHBOARD_VENDOR)/uPlot.iife.min.js $(DASHBOARD_VENDOR)/uPlot.min.css

.PHONY: dashboard-assets
dashboard-assets: $(DASHBOARD_ASSETS)

# A pattern rule with two targets makes both in one run, in any GNU make (the stem is ".").
$(DASHBOARD_VENDOR)/uPlot%iife.min.js $(DASHBOARD_VENDOR)/uPlot%min.css: web/package-lock.json web/package.json web/copy-vendor.mjs
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix web --no-audit --no-fund && node web/copy-vendor.mjs; \
	elif [ -f $(DASHBOARD_VENDOR)/uPlot.iife.min.js ] && [ -f $(DASHBOARD_VENDOR)/uPlot.min.css ]; then \
		echo "dashboard-assets: npm not found; keeping the vendor files in $(DASHBOARD_VENDOR)"; \
		touch $(DASHBOARD_ASSETS); \
	else \
		echo "dashboard-assets: npm is needed to fetch uPlot (apt-get install npm)" >&2; exit 1; \
	fi
