# Build and install the launcher and the library where the launcher finds them:
#   make install PREFIX=/opt/mrcache   ->  $(PREFIX)/bin/mrcache, $(PREFIX)/lib/libmrcache.so,
#   the manual pages (share/man/man1, man7) and the bash/zsh/fish completions, written
#   from the code by `mrcache __generate` (src/generate.rs).
PREFIX ?= /usr/local
CARGO ?= cargo

.PHONY: build install uninstall test demo

build:
	$(CARGO) build --release --workspace

GEN = target/generated
SHARE = $(DESTDIR)$(PREFIX)/share

install: build
	rm -rf $(GEN) && target/release/mrcache __generate $(GEN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(SHARE)/man/man1 $(SHARE)/man/man7 \
	  $(SHARE)/bash-completion/completions $(SHARE)/zsh/site-functions $(SHARE)/fish/vendor_completions.d
	install -m 755 target/release/mrcache $(DESTDIR)$(PREFIX)/bin/mrcache
	install -m 755 target/release/libmrcache.so $(DESTDIR)$(PREFIX)/lib/libmrcache.so
	install -m 644 $(GEN)/man1/*.1 $(SHARE)/man/man1/
	install -m 644 $(GEN)/man7/*.7 $(SHARE)/man/man7/
	install -m 644 $(GEN)/completions/mrcache.bash $(SHARE)/bash-completion/completions/mrcache
	install -m 644 $(GEN)/completions/_mrcache $(SHARE)/zsh/site-functions/_mrcache
	install -m 644 $(GEN)/completions/mrcache.fish $(SHARE)/fish/vendor_completions.d/mrcache.fish

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/mrcache $(DESTDIR)$(PREFIX)/lib/libmrcache.so
	rm -f $(SHARE)/man/man1/mrcache.1 $(SHARE)/man/man1/mrcache-*.1 $(SHARE)/man/man7/mrcache-config.7
	rm -f $(SHARE)/bash-completion/completions/mrcache $(SHARE)/zsh/site-functions/_mrcache \
	  $(SHARE)/fish/vendor_completions.d/mrcache.fish

test:
	./ci/test

demo:
	./ci/demo
