# Build and install the launcher and the library where the launcher finds them:
#   make install PREFIX=/opt/mrcache   ->  $(PREFIX)/bin/mrcache, $(PREFIX)/lib/libmrcache.so
PREFIX ?= /usr/local
CARGO ?= cargo

.PHONY: build install uninstall test demo

build:
	$(CARGO) build --release --workspace

install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib
	install -m 755 target/release/mrcache $(DESTDIR)$(PREFIX)/bin/mrcache
	install -m 755 target/release/libmrcache.so $(DESTDIR)$(PREFIX)/lib/libmrcache.so

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/mrcache $(DESTDIR)$(PREFIX)/lib/libmrcache.so

test:
	./ci/test

demo:
	./ci/demo
