// `node --import ./hide-optional-peers.mjs app.js`: the packages named in HIDDEN_PACKAGES
// (comma-separated) cannot be imported, as if they were not installed, so the app shows what a
// user who skipped the optional peers gets.
import { register } from 'node:module';

register('./hide-optional-peers.hooks.mjs', import.meta.url, {
  data: { hidden: (process.env.HIDDEN_PACKAGES ?? '').split(',').filter(Boolean) },
});
